"""`infer FILE` and `port FILE` read the module: its `jax.shard_map` calls, with the mesh, the
specs and example arguments they are given.

Two sources, the first winning:

1. **The calls themselves.** The module is imported (its own import-time code runs: meshes
   made, `jax.set_mesh` called, decorators applied, module-level arrays built) with a profile
   hook (`sys.setprofile`, this thread, removed when the import returns; nothing is patched)
   that records every call of `jax.shard_map` made by the file: the decorator forms
   (`@jax.shard_map(mesh=..., in_specs=..., out_specs=...)`, `@partial(jax.shard_map, ...)`),
   assignments (`f = jax.shard_map(body, ...)`), `functools.partial` bodies, calls inside
   functions the import runs. The objects are read from `jax.shard_map`'s own parameters
   (public API) at the call, and `mesh=None` is the mesh `jax.set_mesh` / `use_mesh` had made
   current at that moment (a `with` block included; inside `jax.jit`, where only its
   abstract mesh shows, a mesh of the same axes on this process's devices). `record_calls`
   runs a function under the same hook (`port --enable-vma --run`): the calls several files
   make while it runs, at any depth.
2. **The source.** A `jax.shard_map(name, ...)` call in a function the import did not run
   (`def build(mesh): return jax.shard_map(step, mesh=mesh, ...)`): the body and each keyword
   are evaluated in the module's globals when they name module-level objects only (a
   parameter or local of the enclosing function is unknown: `--mesh`, `--in-specs`, ...).

Example arguments, the first found winning: the arguments of the first call of the shard_map'd
function the import makes (recorded by the same hook: `f(jnp.arange(16.0).reshape(4, 4))` in a
notebook's cell, a call under `jax.jit` gives its shapes and dtypes); else a call of the
shard_map'd object anywhere in the file (module level, a `__main__` block, a function) whose
arguments are module-level names (or attributes / subscripts of them) bound to arrays, read
after the import: the global shapes, dtypes and shardings.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import importlib.util
import inspect
import os
import sys
from collections.abc import Iterator
from typing import Any

import jax

from .. import _compat
from ..adapters import _conventions

#: a keyword the module's call site did not let us evaluate
UNKNOWN: Any = type("Unknown", (), {"__repr__": lambda self: "<unknown>"})()


@dataclasses.dataclass
class Site:
    """One `jax.shard_map` call of the module."""

    body: Any                    # the per-shard function (a partial, a jitted function, ...)
    name: str                    # the body's name
    line: int | None             # the line of the call (of the decorator)
    mesh: Any                    # None: not given and no mesh current; UNKNOWN: not evaluable
    in_specs: Any
    out_specs: Any
    axis_names: Any = frozenset()
    check_vma: Any = True
    mapped: Any = None           # what jax.shard_map returned (None: found in the source only)
    args: tuple[Any, ...] | None = None  # example global arguments the module passes it
    #: no `mesh=` at the call: JAX takes the mesh current when the function is called, which
    #: the first recorded call gives (a decorator applied before `with jax.set_mesh(...)`)
    context_mesh: bool = False
    names: tuple[str, ...] = ()  # the module-level names bound to `mapped` (or jit of it)
    file: str | None = None      # the file of the call (`record_calls`: one of several)

    def matches(self, func: str) -> bool:
        return func == self.name or func in self.names


def _shard_map_code() -> Any:
    return inspect.unwrap(jax.shard_map).__code__


def _user_frame(frame: Any) -> Any:
    """The frame that called, past `functools.partial`'s (JAX's own calls of shard_map, made
    while the module's code runs, are JAX's frames: not the file's calls)."""
    while frame is not None and frame.f_code.co_filename == functools.__file__:
        frame = frame.f_back
    return frame


class _Recorder:
    """The profile hook: `jax.shard_map`'s calls made by the files `files`, with what they
    returned."""

    def __init__(self, files: frozenset[str]) -> None:
        self.files = files
        self.code = _shard_map_code()
        self.sites: list[Site] = []
        self._open: dict[int, tuple[Site | None, dict[str, Any]]] = {}
        #: decorator factories (`jax.shard_map(out_specs=...)` without a function) not applied yet
        self._factories: list[tuple[Any, dict[str, Any]]] = []
        self._applying: dict[int, tuple[dict[str, Any], Any]] = {}

    def _record(self, loc: dict[str, Any], caller: Any) -> dict[str, Any]:
        mesh = loc.get("mesh")
        if mesh is None:
            mesh = _concrete(_compat.context_mesh(concrete=True))
        return {"mesh": mesh, "context_mesh": loc.get("mesh") is None,
                "in_specs": loc.get("in_specs", _compat.INFER),
                "out_specs": loc.get("out_specs"), "axis_names": loc.get("axis_names", frozenset()),
                "check_vma": loc.get("check_vma", True),
                "line": caller.f_lineno if caller is not None else None,
                "file": caller.f_code.co_filename if caller is not None else None}

    def _called(self, frame: Any) -> None:
        """A call of a shard_map'd function (JAX's `wrapped(*args)`, the body its free `f`):
        its arguments are the example arguments of the site that made it, if it has none
        (a body of no arguments, `in_specs=()`, has them: none)."""
        loc = frame.f_locals
        body, args = loc.get("f"), loc.get("args")
        if body is None or not isinstance(args, tuple) or (args and not _arrays(args)):
            return
        for site in reversed(self.sites):
            if site.body is body:
                if site.args is None:
                    if site.context_mesh:
                        site.mesh = _called_on(site.mesh)
                    site.args = tuple(jax.tree_util.tree_map(
                        functools.partial(_example, mesh=site.mesh), args))
                return

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event not in ("call", "return"):
            return
        code = frame.f_code
        if code.co_name == "wrapped" and event == "call" and \
                code.co_filename == self.code.co_filename:
            self._called(frame)
            return
        if code is self.code:
            if event == "call":
                caller = _user_frame(frame.f_back)
                if caller is None or caller.f_code.co_filename not in self.files:
                    return
                self._open[id(frame)] = (None, {**self._record(frame.f_locals, caller),
                                                "f": frame.f_locals.get("f")})
            elif id(frame) in self._open:
                _, rec = self._open.pop(id(frame))
                if arg is None:
                    return  # raised
                if rec["f"] is None:
                    self._factories.append((arg, rec))
                else:
                    self._add(rec["f"], rec, arg)
            return
        if event == "call" and self._factories and \
                code is getattr(self._factories[-1][0], "__code__", None):
            _, rec = self._factories.pop()
            names = code.co_varnames[:code.co_argcount]
            body = frame.f_locals.get(names[0]) if names else None
            self._applying[id(frame)] = (rec, body)
        elif event == "return" and id(frame) in self._applying:
            rec, body = self._applying.pop(id(frame))
            if arg is not None:
                self._add(body, rec, arg)

    def _add(self, body: Any, rec: dict[str, Any], mapped: Any) -> None:
        self.sites.append(Site(body=body, name=_conventions.fn_name(body), line=rec["line"],
                               mesh=rec["mesh"], in_specs=rec["in_specs"],
                               out_specs=rec["out_specs"], axis_names=rec["axis_names"],
                               check_vma=rec["check_vma"], mapped=mapped,
                               context_mesh=rec["context_mesh"], file=rec["file"]))


def _called_on(recorded: Any) -> Any:
    """The mesh a function shard_map'd without `mesh=` is called on: the one current at the
    call; under `jax.jit` only its abstract mesh is known there, so `recorded` (current when
    `jax.shard_map` was called) stands when it has the same axes, and else the abstract
    mesh made concrete (`_concrete`)."""
    current = _compat.context_mesh(concrete=True)
    if current is None or isinstance(current, jax.sharding.Mesh):
        return current if current is not None else recorded
    same = recorded is not None and recorded is not UNKNOWN and \
        tuple(current.axis_names) == tuple(recorded.axis_names) and \
        tuple(current.axis_sizes) == tuple(recorded.axis_sizes)
    return recorded if same else _concrete(current)


def _concrete(mesh: Any) -> Any:
    """A mesh with devices for an abstract one (all that `jax.set_mesh` shows inside
    `jax.jit`, where a model's shard_map is called without `mesh=`): the same axis names,
    sizes and types on this process's devices (`jax.make_mesh`), which is what tracing the
    body and comparing its numbers need; unknown (`--mesh`) when the devices are too few."""
    if mesh is None or isinstance(mesh, jax.sharding.Mesh) or not getattr(mesh, "axis_names", ()):
        return mesh
    try:
        return jax.make_mesh(tuple(mesh.axis_sizes), tuple(mesh.axis_names),
                             axis_types=tuple(mesh.axis_types))
    except (ValueError, TypeError, AttributeError):
        return UNKNOWN


def _example(x: Any, mesh: Any) -> Any:
    """An argument kept as an example: an array as it is, a traced one (a call under
    `jax.jit`) as its shape, dtype and the sharding its type carries on `mesh` (the tracer does
    not outlive the trace; `in_specs` left to JAX are read from that sharding)."""
    if not isinstance(x, jax.core.Tracer):
        return x
    spec = getattr(getattr(jax.typeof(x), "sharding", None), "spec", None)
    if spec is None or not isinstance(mesh, jax.sharding.Mesh):
        return jax.ShapeDtypeStruct(x.shape, x.dtype)
    return jax.ShapeDtypeStruct(x.shape, x.dtype,
                                sharding=jax.sharding.NamedSharding(mesh, spec))


def import_file(path: str) -> tuple[Any, list[Site]]:
    """Import `path` (as `import` would: registered in `sys.modules` under its stem) and
    record its `jax.shard_map` calls."""
    path = os.path.abspath(path)
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # the module's siblings, as `python FILE` sees them
    with _recording([module.__file__ or path]) as rec:
        spec.loader.exec_module(module)
    return module, rec.sites


@contextlib.contextmanager
def _recording(files: Any) -> Iterator[_Recorder]:
    """The profile hook (`_Recorder`) of the calls the files `files` (paths) make, on this
    thread while the block runs."""
    rec = _Recorder(frozenset(os.path.abspath(f) for f in files))
    old = sys.getprofile()
    sys.setprofile(rec)
    try:
        yield rec
    finally:
        sys.setprofile(old)


def signature(args: Any) -> tuple[Any, ...]:
    """The shapes and dtypes of a call's arguments: what makes two calls of one site trace
    different programs (a model's prefill and its decode step)."""
    return tuple((tuple(getattr(x, "shape", ())), str(getattr(x, "dtype", type(x).__name__)))
                 for x in jax.tree_util.tree_leaves(args))


def record_calls(fn: Any, files: Any) -> tuple[list[Site], BaseException | None]:
    """Call `fn()` with the same hook as `import_file`: the `jax.shard_map` calls made by the
    files `files` (paths) while it runs, at any depth (a shard_map decorating a function
    defined inside the model's `attention`, called by the step `fn` runs), one site per
    file, line and argument `signature` (the first such call's: a prefill and a decode step
    are two); and the exception `fn` raised, or None."""
    raised: BaseException | None = None
    with _recording(files) as rec:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - the caller reports it (JAX's verdict, mostly)
            raised = e
    first: dict[tuple[Any, ...], Site] = {}
    for site in rec.sites:
        first.setdefault((site.file, site.line, signature(site.args)), site)
    return list(first.values()), raised


# ------------------------------------------------------------------- the source


def _bound_locals(fn: ast.AST) -> set[str]:
    out: set[str] = set()
    if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        a = fn.args
        out |= {p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
        out |= {p.arg for p in (a.vararg, a.kwarg) if p is not None}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
    return out


class _Scoped(ast.NodeVisitor):
    """Every call with the names bound by its enclosing functions."""

    def __init__(self) -> None:
        self.calls: list[tuple[ast.Call, set[str]]] = []
        self._locals: list[set[str]] = [set()]

    def _fn(self, node: Any) -> None:
        self._locals.append(self._locals[-1] | _bound_locals(node))
        self.generic_visit(node)
        self._locals.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _fn

    def visit_Call(self, node: ast.Call) -> None:
        self.calls.append((node, self._locals[-1]))
        self.generic_visit(node)


def _evaluable(node: ast.expr, local: set[str]) -> bool:
    if any(isinstance(n, ast.Name) and n.id in local for n in ast.walk(node)):
        return False
    return not any(isinstance(n, (ast.Call, ast.Lambda, ast.NamedExpr, ast.Await, ast.Yield))
                   for n in ast.walk(node)) or _spec_call(node)


def _spec_call(node: ast.expr) -> bool:
    """Literal `P(...)` / tuples of them: calls, but only of the spec constructor."""
    calls = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
    return all(isinstance(c.func, (ast.Name, ast.Attribute)) and
               (c.func.id if isinstance(c.func, ast.Name) else c.func.attr)
               in ("P", "PartitionSpec", "frozenset", "set") for c in calls)


def _eval(node: ast.expr, local: set[str], env: dict[str, Any]) -> Any:
    if not _evaluable(node, local):
        return UNKNOWN
    try:
        return eval(compile(ast.Expression(node), "<spec>", "eval"), env)  # noqa: S307
    except Exception:  # noqa: BLE001 - not evaluable at module level
        return UNKNOWN


def _reaches(obj: Any, target: Any) -> bool:
    for _ in range(8):
        if obj is target:
            return True
        obj = getattr(obj, "__wrapped__", None)
        if obj is None:
            return False
    return False


def _arrays(value: Any) -> bool:
    leaves = jax.tree_util.tree_leaves(value)
    return bool(leaves) and all(hasattr(x, "shape") and hasattr(x, "dtype") for x in leaves)


def read_source(module: Any, sites: list[Site], source: str) -> list[Site]:
    """`sites` completed from the source: the shard_map calls the import did not run, the
    module-level names bound to each shard_map'd object, and example arguments."""
    env = module.__dict__
    tree = ast.parse(source)
    scoped = _Scoped()
    scoped.visit(tree)
    for site in sites:
        site.names = tuple(n for n, v in env.items() if site.mapped is not None
                           and callable(v) and _reaches(v, site.mapped))
    seen_lines = {s.line for s in sites}
    smap_names = {n for n, v in env.items() if v is jax.shard_map}
    for call, local in scoped.calls:
        func = call.func
        is_smap = (isinstance(func, ast.Attribute) and func.attr == "shard_map") or \
            (isinstance(func, ast.Name) and func.id in smap_names)
        if is_smap and call.lineno not in seen_lines and call.args \
                and isinstance(call.args[0], ast.Name) and call.args[0].id not in local:
            body = env.get(call.args[0].id)
            if not callable(body):
                continue
            kw = {k.arg: _eval(k.value, local, env) for k in call.keywords if k.arg}
            mesh = kw.get("mesh", None)
            if mesh is None:
                mesh = _compat.context_mesh(concrete=True)
            sites.append(Site(body=body, name=_conventions.fn_name(body), line=call.lineno,
                              mesh=mesh, in_specs=kw.get("in_specs", _compat.INFER),
                              out_specs=kw.get("out_specs", UNKNOWN),
                              axis_names=kw.get("axis_names", frozenset()),
                              check_vma=kw.get("check_vma", True)))
    # example arguments: a call of the shard_map'd object on module-level arrays
    for site in sites:
        if site.mapped is None:
            continue
        for call, local in scoped.calls:
            if site.args is not None:
                break
            if call.keywords or any(isinstance(a, ast.Starred) for a in call.args):
                continue
            target = _eval(call.func, local, env)
            if target is UNKNOWN or not _reaches(target, site.mapped):
                continue
            values = [_eval(a, local, env) for a in call.args]
            if values and all(v is not UNKNOWN and _arrays(v) for v in values):
                site.args = tuple(values)
    sites.sort(key=lambda s: s.line or 0)
    return sites


def discover(path: str) -> tuple[Any, list[Site]]:
    """Import `path` and return `(module, sites)`: every shard_map call of the file."""
    module, sites = import_file(path)
    with open(path, encoding="utf-8") as fh:
        source = fh.read()
    return module, read_source(module, sites, source)


def missing(site: Site) -> list[str]:
    """What a site still needs from the command line to be traced."""
    need = []
    if site.mesh is None or site.mesh is UNKNOWN:
        need.append("--mesh")
    if site.in_specs is UNKNOWN:
        need.append("--in-specs")
    if site.out_specs is UNKNOWN or site.out_specs is None:
        need.append("--out-specs")
    if site.args is None:
        need.append("--shapes")
    return need


@dataclasses.dataclass
class Job:
    """One shard_map body to trace: what `infer` / `observe` take."""

    fn: Any
    name: str
    args: tuple[Any, ...]
    mesh: Any
    in_specs: Any
    out_specs: Any
    axis_names: Any = frozenset()
    check_vma: Any = True        # as the module wrote it (UNKNOWN: not a literal)
    where: str = ""


def job(site: Site, flags: Any, P: Any, where: str) -> Job | str:
    """The site with the command line's `--mesh` / `--in-specs` / `--out-specs` / `--shapes`
    filled in (the flags win); a message naming the missing flags when it cannot be traced."""
    from .args import parse_specs

    mesh = flags.mesh_obj if flags.mesh_obj is not None else site.mesh
    in_specs = parse_specs(flags.in_specs, P) if flags.in_specs else site.in_specs
    out_specs = parse_specs(flags.out_specs, P) if flags.out_specs else site.out_specs
    args = flags.sds if flags.sds is not None else site.args
    filled = dataclasses.replace(site, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                 args=args)
    need = missing(filled)
    if need:
        return (f"{where}: jax.shard_map({site.name}): cannot tell its "
                f"{', '.join(n.removeprefix('--') for n in need)}: pass {' '.join(need)}")
    if isinstance(in_specs, P):
        in_specs = (in_specs,) if len(args) == 1 else in_specs
    return Job(fn=site.body, name=site.name, args=tuple(args), mesh=mesh, in_specs=in_specs,
               out_specs=out_specs, axis_names=site.axis_names,
               check_vma=site.check_vma, where=where)
