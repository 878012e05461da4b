"""`port --enable-vma` / `infer --vma-changes`: code written for `jax.shard_map(...,
check_vma=False)` turned into the program JAX accepts with its checks on, and what turning
them on changes in the numbers.

1. `enable_checks`: every literal `check_vma=False` of a shard_map call becomes `True`.
2. `migrate`: the candidate is traced with the checks on (`trace_job`, by the caller's
   `trace`); each error JAX raises about a loop carry (`fori_loop`, `scan`, `while_loop`:
   the initial carry is Invariant, the body makes it Varying) or about `cond` / `switch`
   branches in different states is fixed by a source edit (`jax.lax.pcast(..., to='varying')`
   on the initial carry / on the Invariant branch's output, `_compat.vary_cast_source`), and
   the candidate traced again, until JAX accepts it or an error has no fix (reported with its
   line). The edits never add a line: the module's line numbers stay the original's.
3. The semantic changes: `compare` runs the original and the migrated shard_map on the same
   random inputs; `gradient_psums` reads `st.adapters.infer`'s SPMD103 (a psum / pmean of an
   Invariant value: typically the gradient of a replicated parameter, which JAX's transpose
   now sums itself); `axis_size_idioms` finds `psum(1, axis)`.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import tempfile
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from ... import _compat
from ..._errors import SpmdTypeError
from ..._errors.jax_messages import translate
from .._infer import abstract_args, infer


@dataclasses.dataclass
class Change:
    """One line of the report: where, what changes when the checks are turned on, the fix.

    `kind`: "edit" (made by the migration), "error" (JAX still rejects the program: no fix
    applies), "numbers" (the migrated program computes other numbers, or would), "note"
    (something that could not be checked: the programs did not run)."""

    line: int | None
    what: str
    fix: str
    kind: str = "edit"
    #: the file of `line` when it is not the migrated module's: a helper module its shard_map
    #: bodies call (`migrate`'s `helpers`)
    file: str | None = None

    def render(self, path: str) -> str:
        path = self.file or path
        where = f"{path}:{self.line}" if self.line is not None else f"{path}:?"
        return f"{where}: {self.what}; fix: {self.fix}"


@dataclasses.dataclass
class Migration:
    """The migrated source and the report lines, in order (edits, then errors left), and the
    migrated source of each helper module (`migrate`'s `helpers`, by path)."""

    source: str
    changes: list[Change]
    helpers: dict[str, str] = dataclasses.field(default_factory=dict)


# ------------------------------------------------------------------- source text


def _offsets(source: str) -> list[int]:
    starts, pos = [], 0
    for line in source.splitlines(keepends=True):
        starts.append(pos)
        pos += len(line)
    starts.append(pos)
    return starts


def _pos(source: str, starts: list[int], line: int, col: int) -> int:
    # ast columns are UTF-8 byte offsets into the line
    text = source[starts[line - 1]:starts[line]]
    return starts[line - 1] + len(text.encode("utf-8")[:col].decode("utf-8"))


def _span(source: str, node: ast.AST) -> tuple[int, int]:
    starts = _offsets(source)
    return (_pos(source, starts, node.lineno, node.col_offset),  # type: ignore[attr-defined]
            _pos(source, starts, node.end_lineno, node.end_col_offset))  # type: ignore[attr-defined]


def _replace(source: str, node: ast.AST, make: Callable[[str], str]) -> str:
    a, b = _span(source, node)
    return source[:a] + make(source[a:b]) + source[b:]


def lax_name(source: str) -> str:
    """How the module names `jax.lax` (`jax.lax`, `lax`, an alias)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom) and node.module == "jax" and not node.level:
            for a in node.names:
                if a.name == "lax":
                    return a.asname or "lax"
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "jax.lax" and a.asname:
                    return a.asname
                if a.name == "jax":
                    return f"{a.asname or 'jax'}.lax"
    return "jax.lax"


def _func_name(call: ast.Call) -> str | None:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


def _is_shard_map_call(call: ast.Call) -> bool:
    if _func_name(call) == "shard_map":
        return True
    # partial(jax.shard_map, ...)
    return _func_name(call) == "partial" and bool(call.args) and \
        isinstance(call.args[0], (ast.Attribute, ast.Name)) and \
        (getattr(call.args[0], "attr", None) or getattr(call.args[0], "id", None)) == "shard_map"


def enable_checks(source: str) -> tuple[str, list[Change]]:
    """Every literal `check_vma=False` of a shard_map call turned to `check_vma=True`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and _is_shard_map_call(node):
            for kw in node.keywords:
                if kw.arg == "check_vma" and isinstance(kw.value, ast.Constant) \
                        and kw.value.value is False:
                    found.append(kw.value)
    changes = []
    for value in sorted(found, key=lambda v: (v.lineno, v.col_offset), reverse=True):
        source = _replace(source, value, lambda _: "True")
        changes.append(Change(value.lineno, "jax.shard_map(..., check_vma=False): JAX's "
                              "manual-axis checks were off", "check_vma=True"))
    return source, changes[::-1]


# ------------------------------------------------------------------- JAX's errors -> edits


@dataclasses.dataclass
class Fix:
    """What one JAX error asks for: a Varying cast of a loop's initial carry (`path` into it)
    or of a branch's output."""

    kind: str                    # "carry" or "branch"
    calls: tuple[str, ...]       # the lax functions whose call it is about
    line: int | None
    axes: tuple[str, ...]
    path: tuple[int, ...] = ()   # carry: the component of the loop's carry
    branch: str | int = ""       # branch: "true_fun", "false_fun" or a switch index


def _varying(jax_type: str) -> set[str]:
    m = re.search(r"\{([^}]*)\}", jax_type)
    if m is None:
        return set()
    v = re.search(r"V:\s*(\([^)]*\)|[\w]+)", m.group(1))
    if v is None:
        return set()
    return {a.strip(" ()'\"") for a in v.group(1).split(",") if a.strip(" ()'\"")}


def _ordered(axes: set[str], mesh_order: Sequence[str]) -> tuple[str, ...]:
    return tuple(sorted(axes, key=lambda a: (list(mesh_order).index(a)
                                             if a in mesh_order else len(mesh_order), a)))


_LOOP = re.compile(r"(scan|while_loop) body function carry input and carry output")
_CARRY = re.compile(r"the input carry (?:component )?(?P<name>\w+)(?P<path>(?:\[\d+\])*) has "
                    r"type (?P<tin>.+?) but the corresponding output carry component has type "
                    r"(?P<tout>.+?), so the manual", re.IGNORECASE)
_BRANCHES = re.compile(r"(cond|switch) branches must have equal output types")
_BRANCH = re.compile(r"the output of (?P<a>.+?) has type (?P<ta>.+?) but the corresponding "
                     r"output of (?P<b>.+?) has type (?P<tb>.+?), so the manual", re.IGNORECASE)


def _same_file(a: str | None, b: str) -> bool:
    return a is not None and os.path.abspath(a) == os.path.abspath(b)


def error_line(e: BaseException, file: str) -> int | None:
    """The innermost line of `file` in the traceback of `e`."""
    line = None
    for fs in traceback.extract_tb(e.__traceback__):
        if os.path.abspath(fs.filename) == os.path.abspath(file):
            line = fs.lineno
    return line


def error_files(e: BaseException, files: Sequence[str]) -> list[str]:
    """The files of `files` that the traceback of `e` passes through, innermost first."""
    wanted = {os.path.abspath(f): f for f in files}
    seen: list[str] = []
    for fs in reversed(traceback.extract_tb(e.__traceback__)):
        f = wanted.get(os.path.abspath(fs.filename))
        if f is not None and f not in seen:
            seen.append(f)
    return seen


def raised_in(e: BaseException, folder: str, given: Sequence[str] = ()) -> tuple[str, int] | None:
    """The innermost frame of the traceback of `e` in a module of `folder` but those `given`:
    where JAX's error is raised when the shard_map body calls a sibling module the migration
    was not given (a kernel library next to the training script; the candidate and the
    modules given are imported from a temporary folder)."""
    skip = {os.path.abspath(f) for f in given}
    for fs in reversed(traceback.extract_tb(e.__traceback__)):
        f = os.path.abspath(fs.filename)
        if os.path.dirname(f) == os.path.abspath(folder) and f not in skip \
                and fs.lineno is not None:
            return f, fs.lineno
    return None


def parse_error(e: BaseException, file: str, mesh_order: Sequence[str] = ()) -> list[Fix]:
    """The edits JAX's error `e` asks for, one per mismatched carry component / branch output
    JAX names ([]: not a carry / branch state mismatch)."""
    text = str(e)
    line = error_line(e, file)
    fixes = []
    head = _LOOP.search(text)
    if head is not None:
        calls = ("scan", "fori_loop") if head.group(1) == "scan" else ("while_loop", "fori_loop")
        for m in _CARRY.finditer(text):
            axes = _varying(m.group("tout")) - _varying(m.group("tin"))
            if axes:
                path = tuple(int(i) for i in re.findall(r"\d+", m.group("path")))
                fixes.append(Fix("carry", calls, line, _ordered(axes, mesh_order), path=path))
        return fixes
    head = _BRANCHES.search(text)
    if head is not None:
        for m in _BRANCH.finditer(text):
            va, vb = _varying(m.group("ta")), _varying(m.group("tb"))
            # a pytree output: "the output of true_fun at path [0][1] ... the corresponding
            # output of false_fun": the path names the same output of both branches
            (a, path_a), (b, path_b) = _at_path(m.group("a")), _at_path(m.group("b"))
            path = path_a or path_b
            name, axes = (a, vb - va) if vb - va else (b, va - vb)
            if axes and " at path " not in name:
                index = re.fullmatch(r"branch ?(\d+)", name)
                branch: str | int = int(index.group(1)) if index else name
                fixes.append(Fix("branch", (head.group(1),), line, _ordered(axes, mesh_order),
                                 path=path, branch=branch))
    return fixes


def _at_path(name: str) -> tuple[str, tuple[int, ...]]:
    """A branch as JAX's message names one of its outputs: `true_fun at path [0][1]` ->
    `("true_fun", (0, 1))`; without a path, `(name, ())`."""
    at = re.fullmatch(r"(.+?) at path ((?:\[\d+\])+)", name.strip())
    if at is None:
        return name.strip(), ()
    return at.group(1), tuple(int(i) for i in re.findall(r"\d+", at.group(2)))


def _the_call(tree: ast.AST, line: int, names: Sequence[str]) -> ast.Call | None:
    """The innermost call of one of `names` spanning `line`."""
    best = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _func_name(node) in names \
                and node.lineno <= line <= (node.end_lineno or node.lineno):
            if best is None or (node.lineno, -(node.end_lineno or 0)) > \
                    (best.lineno, -(best.end_lineno or 0)):
                best = node
    return best


def _assigned(tree: ast.AST, name: str, before: int) -> ast.expr | None:
    """The value of the last plain `name = ...` above line `before`."""
    best = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and node.lineno < before and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == name \
                and (best is None or node.lineno > best.lineno):
            best = node
    return best.value if best is not None else None


def _arg(call: ast.Call, index: int, keyword: str) -> ast.expr | None:
    if len(call.args) > index and not any(isinstance(a, ast.Starred) for a in call.args[:index + 1]):
        return call.args[index]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


#: the initial carry of each loop: (position, keyword)
_INIT = {"fori_loop": (3, "init_val"), "scan": (1, "init"), "while_loop": (2, "init_val")}


def apply_fix(source: str, fix: Fix) -> tuple[str, Change] | None:
    """`source` with the edit `fix` asks for, and its report line (None: no edit applies)."""
    if fix.line is None:
        return None
    tree = ast.parse(source)
    call = _the_call(tree, fix.line, fix.calls)
    if call is None:
        return None
    lax = lax_name(source)
    name = _func_name(call) or ""
    cast = _compat.vary_cast_source("{}", fix.axes, lax)
    if fix.kind == "carry":
        node = _arg(call, *_INIT[name])
        # fori_loop's carry is JAX's (i, init) (or (i, upper, init)): its first index is JAX's
        path = fix.path[1:] if name == "fori_loop" else fix.path
        if isinstance(node, ast.Name) and path:
            # `init = (...)` then `scan(step, init, ...)`: the component is in the assignment
            node = _assigned(tree, node.id, call.lineno) or node
        for i in path:
            if isinstance(node, (ast.Tuple, ast.List)) and i < len(node.elts):
                node = node.elts[i]
            else:
                return None
        if node is None:
            return None
        part = "".join(f"[{i}]" for i in path)
        new = _replace(source, node, lambda text: cast.replace("{}", text, 1))
        return new, Change(node.lineno, f"{name}: the initial carry{part} is Invariant and the "
                           f"body makes it Varying over {', '.join(fix.axes)}",
                           cast.replace("{}", f"init{part}", 1) + " on the initial carry")
    if name == "cond":
        where = {"true_fun": 1, "false_fun": 2}.get(str(fix.branch))
        node = _arg(call, where, str(fix.branch)) if where is not None else None
    else:
        branches = _arg(call, 1, "branches")
        node = branches.elts[fix.branch] if isinstance(branches, (ast.Tuple, ast.List)) \
            and isinstance(fix.branch, int) and fix.branch < len(branches.elts) else None
    if node is None:
        return None
    if isinstance(node, ast.Lambda):
        node = node.body
        for i in fix.path:  # a component of a literal tuple the branch returns
            if isinstance(node, (ast.Tuple, ast.List)) and i < len(node.elts):
                node = node.elts[i]
            else:
                return None
        new = _replace(source, node, lambda text: cast.replace("{}", text, 1))
    elif fix.path:
        return None  # a component of a named branch's output: not in this call's text
    else:
        simple = isinstance(node, (ast.Name, ast.Attribute))
        new = _replace(source, node, lambda text: "lambda *a: " + cast.replace(
            "{}", f"{text}(*a)" if simple else f"({text})(*a)", 1))
    which = fix.branch if isinstance(fix.branch, str) else f"branch {fix.branch}"
    which += "".join(f"[{i}]" for i in fix.path)
    return new, Change(node.lineno, f"{name}: the output of {which} is Invariant and the other "
                       f"branch's is Varying over {', '.join(fix.axes)}",
                       cast.replace("{}", "out", 1) + f" on the output of {which}")


def trace_job(job: Any) -> BaseException | None:
    """Trace one shard_map body (`job`: `fn`, `args`, `mesh`, `in_specs`, `out_specs`,
    `axis_names`) with JAX's checks on; the exception JAX raises, or None."""
    sds = abstract_args(job.args, job.in_specs, job.mesh)
    f = _compat.shard_map(job.fn, mesh=job.mesh, in_specs=job.in_specs, out_specs=job.out_specs,
                          axis_names=job.axis_names, check_vma=True)
    try:
        jax.make_jaxpr(f)(*sds)
    except Exception as e:  # noqa: BLE001 - JAX's verdict is the result
        return e
    return None


def migrate(path: str, source: str,
            trace: Callable[[str], Sequence[tuple[BaseException, int | None]]],
            mesh_order: Sequence[str] = (), max_steps: int = 64,
            helpers: Mapping[str, str] | None = None) -> Migration:
    """Turn the checks on in `source` (the text of `path`) and fix what JAX rejects.

    `trace(candidate_path)` imports the candidate (written next to nothing: a temporary
    folder, under `path`'s file name) and returns the exceptions its shard_map bodies raise
    with the checks on, each with the line of its shard_map call (the line reported when the
    traceback names none of the file's: an out_specs error, raised where JAX checks them).

    `helpers` (path -> source): modules the bodies call (a kernel library next to the
    training script), written into the same folder under their file names, which `trace`
    imports anew each time. An error is fixed in the innermost of the files its traceback
    passes through (the `cond` of a helper's function is edited in the helper)."""
    source, changes = enable_checks(source)
    sources = {path: source, **(helpers or {})}
    remaining: list[Change] = []
    with tempfile.TemporaryDirectory(prefix="spmdtyped-vma-") as tmp:
        at = {p: os.path.join(tmp, os.path.basename(p)) for p in sources}
        if len(set(at.values())) < len(at):
            raise ValueError(f"{path}: the helper modules need distinct file names: "
                             f"{', '.join(sorted(sources))}")
        back = {c: p for p, c in at.items()}
        helper_at = {c: p for c, p in back.items() if p != path}
        for _ in range(max_steps):
            for p, text in sources.items():
                with open(at[p], "w", encoding="utf-8") as fh:
                    fh.write(text)
            errors = trace(at[path])
            remaining = []
            progressed = False
            for e, site in errors:
                for file in error_files(e, list(at.values())):
                    p = back[file]
                    for fix in parse_error(e, file, mesh_order):
                        made = apply_fix(sources[p], fix)
                        if made is not None:
                            sources[p], change = made
                            change.file = None if p == path else p
                            changes.append(change)
                            progressed = True
                    if progressed:
                        break
                if progressed:
                    break  # trace again: the next error may be a consequence of this one
                remaining.append(_unfixed(e, at[path], site, helper_at,
                                          os.path.dirname(os.path.abspath(path))))
            if not progressed:
                break
    return Migration(sources.pop(path), changes + remaining, sources)


def _unfixed(e: BaseException, file: str, site: int | None = None,
             helpers: Mapping[str, str] | None = None, folder: str | None = None) -> Change:
    """The report line of an error no edit fixes: at the innermost line of `file` (the
    candidate) or of a helper (`helpers`: candidate path -> the helper's own path) in its
    traceback; where it is raised in another module of `folder` (the original's), that
    module named, since the edit belongs there."""
    helpers = helpers or {}
    change = _unfixed_at(e, file, site)
    inner = error_files(e, [file, *helpers])
    if inner and inner[0] != file:
        change.file, change.line = helpers[inner[0]], error_line(e, inner[0])
    if folder is not None:
        other = raised_in(e, folder, list(helpers.values()))
        if other is not None:
            name = os.path.basename(other[0])
            change.what += (f" (raised in {name}:{other[1]}: the edit belongs there; give "
                            f"{name} to port --enable-vma too)")
    return change


def _unfixed_at(e: BaseException, file: str, site: int | None = None) -> Change:
    if isinstance(e, SpmdTypeError):
        # spmdtyped.lax in the body: its strict check, with the checks on (SPMD103: a psum of
        # a value that is already Invariant; the same numbers as before, but said so)
        line = e.line if _same_file(e.file, file) else None
        return Change(line or error_line(e, file) or site,
                      f"{e.code}: spmdtyped.lax rejects it with check_vma=True: "
                      f"{str(e).strip().splitlines()[0][:300]}",
                      e.fix or f"see python -m spmdtyped explain {e.code}", "error")
    err = translate(e)
    line = error_line(e, file) or site
    said = [t.strip() for t in str(e).strip().splitlines() if t.strip()]
    first = said[0] if said else type(e).__name__
    if first.endswith(":") and len(said) > 1:
        first += " " + said[1]  # the line that names the carry / branch
    if err is not None:
        return Change(line, f"{err.code}: JAX rejects it with check_vma=True: {first[:300]}",
                      getattr(err, "fix", None) or "see python -m spmdtyped explain " + err.code,
                      "error")
    if _LOOP.search(str(e)) or _BRANCHES.search(str(e)):
        # a carry or branch mismatch whose value no edit reaches (not written at the call)
        return Change(line, f"SPMD302: JAX rejects it with check_vma=True: {first[:300]}",
                      "give the value the state JAX asks for where it is made: "
                      + _compat.vary_cast_source("value", ("axes",)).replace("('axes',)", "axes"),
                      "error")
    return Change(line, f"JAX rejects it with check_vma=True: {type(e).__name__}: {first[:300]}",
                  "none known: fix it by hand", "error")


# ------------------------------------------------------------------- what changes the numbers


def random_inputs(job: Any, seed: int = 0) -> tuple[Any, ...]:
    """Random global arrays for `job.args` (arrays or ShapeDtypeStructs), placed as the
    in_specs say."""
    rng = np.random.default_rng(seed)
    sds = abstract_args(job.args, job.in_specs, job.mesh)

    def one(s: Any) -> Any:
        dtype = np.dtype(s.dtype)
        if np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.complexfloating):
            value = rng.standard_normal(s.shape).astype(dtype)
        elif dtype == np.bool_:
            value = rng.integers(0, 2, s.shape).astype(bool)
        else:
            value = rng.integers(0, 4, s.shape).astype(dtype)
        return jax.device_put(value, s.sharding)

    return tuple(jax.tree_util.tree_map(one, sds))


def run_job(job: Any, inputs: Sequence[Any], check_vma: bool) -> Any:
    """The outputs of `jax.jit(jax.shard_map(job.fn, ...))(*inputs)`."""
    f = _compat.shard_map(job.fn, mesh=job.mesh, in_specs=job.in_specs, out_specs=job.out_specs,
                          axis_names=job.axis_names, check_vma=check_vma)
    return jax.jit(f)(*inputs)


def compare(original: Any, migrated: Any, line: int | None, seed: int = 0) -> Change | None:
    """The report line when the migrated shard_map (check_vma=True) computes other numbers
    than the original (check_vma=False) on the same random inputs; None when they agree."""
    inputs = random_inputs(original, seed)
    want = jax.tree_util.tree_leaves(run_job(original, inputs, False))
    got = jax.tree_util.tree_leaves(run_job(migrated, inputs, True))
    diffs = [float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
             if np.shape(a) == np.shape(b) else float("inf") for a, b in zip(want, got, strict=True)]
    scale = max([float(np.max(np.abs(np.asarray(a, np.float64)))) for a in want if np.size(a)]
                + [1.0])
    worst = max(diffs, default=0.0)
    if worst <= 1e-5 * scale:
        return None
    return Change(line, f"jax.shard_map({getattr(original, 'name', '?')}): with check_vma=True "
                  f"the outputs differ from check_vma=False's on the same inputs (max |diff| "
                  f"{worst:.3g})", "see the lines below (an explicit psum / pmean of a "
                  "gradient JAX now sums itself)", "numbers")


def gradient_psums(job: Any, file: str, source: str, outputs_differ: bool = True) -> list[Change]:
    """The psum / pmean of an Invariant value (SPMD103) in the migrated body: with the checks
    on, the gradient of a parameter replicated over the axis is already summed by JAX's
    transpose, and the explicit psum multiplies it by the axis size again.

    A forward psum of a replicated value multiplies it by the axis size with the checks on and
    off alike: only a gradient's changes. When the outputs agree (`outputs_differ` False:
    `compare` found none) each one is a "note", not a change of the numbers."""
    rep = infer(job.fn, *job.args, mesh=job.mesh, in_specs=job.in_specs,
                out_specs=job.out_specs, axis_names=job.axis_names)
    lines = source.splitlines()
    out = []
    for v in rep.violations:
        line, vfile = v.line, v.file
        if v.code != "SPMD103" or line is None or \
                (vfile is not None and os.path.abspath(vfile) != os.path.abspath(file)):
            continue
        text = lines[line - 1] if 0 < line <= len(lines) else ""
        if _AXIS_SIZE.search(text):
            continue  # psum(1, axis): axis_size_idioms reports it
        mean = "pmean" in text
        if not outputs_differ:
            out.append(Change(
                line, f"SPMD103: {'pmean' if mean else 'psum'} of a value that is already "
                "Invariant: the outputs agree with check_vma=False's (a replicated value, not "
                "a gradient JAX now sums)", "st.pvary it first to say so, or "
                "x * jax.lax.axis_size(axis)" if not mean else "drop the pmean", "note"))
            continue
        out.append(Change(
            line, f"SPMD103: {'pmean' if mean else 'psum'} of a value that is already Invariant "
            f"(a gradient of a replicated parameter: with check_vma=True JAX's transpose sums "
            f"it); the explicit {'pmean now gives the sum, not the mean' if mean else 'psum now multiplies it by the axis size'}",
            "divide by the axis size instead: g / jax.lax.axis_size(axis)" if mean
            else "drop the psum: the gradient is already summed over the axis", "numbers"))
    return out


_AXIS_SIZE = re.compile(r"\bpsum\(\s*1(?:\.0?)?\s*,")


def axis_size_idioms(source: str) -> list[Change]:
    """`psum(1, axis)` / `psum(1.0, axis)` for the axis size: the same number with the checks
    on (1 is Invariant: psum multiplies it by the size); `jax.lax.axis_size` says it."""
    out = []
    lax = lax_name(source)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and _func_name(node) == "psum" and len(node.args) >= 2 \
                and isinstance(node.args[0], ast.Constant) and node.args[0].value == 1 \
                and not isinstance(node.args[0].value, bool):
            axis = ast.get_source_segment(source, node.args[1]) or "axis"
            out.append(Change(node.lineno, "psum(1, axis) for the axis size: with check_vma=True "
                              "a psum of an Invariant value (the same number)",
                              f"{lax}.axis_size({axis})", "numbers"))
    return sorted(out, key=lambda c: c.line or 0)
