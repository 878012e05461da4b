"""`port --enable-vma` / `infer --vma-changes`: code written for `jax.shard_map(...,
check_vma=False)` turned into the program JAX accepts with its checks on, and what turning
them on changes in the numbers.

1. `enable_checks`: every literal `check_vma=False` of a shard_map call becomes `True`.
2. `migrate`: the candidate is traced with the checks on (`vma_trace.trace_job`, by the caller's
   `trace`); each error JAX raises about a loop carry (`fori_loop`, `scan`, `while_loop`:
   the initial carry is Invariant, the body makes it Varying) or about `cond` / `switch`
   branches in different states is fixed by a source edit (`jax.lax.pcast(..., to='varying')`
   on the initial carry / on the Invariant branch's output, `_compat.vary_cast_source`; a
   Pallas kernel's out_shape given its outputs' states), and the candidate traced again
   (its gradient too), until JAX accepts it or an error has no fix (reported with its line).
   The edits never add or remove a line: the module's line numbers stay the original's.
3. The semantic changes are `vma_numbers`'.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import tempfile
import traceback
from collections.abc import Callable, Collection, Mapping, Sequence

from ... import _compat
from ..._errors import SpmdTypeError
from ..._errors.jax_messages import translate
from .vma_files import write_candidates
from .vma_source import edited, func_name, is_shard_map_call, lax_name, offsets, replace, with_output_states
from .vma_trace import IN_THE_GRADIENT


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
    #: an edit's source text before and after it (`migrate` takes back a cast JAX refuses)
    edit: tuple[str, str] | None = dataclasses.field(default=None, repr=False)

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


def enable_checks(source: str, lines: Collection[int] | None = None
                  ) -> tuple[str, list[Change]]:
    """Every literal `check_vma=False` of a shard_map call turned to `check_vma=True`; with
    `lines`, only those of the calls made at one of them (a call spanning the line, or the
    decorator of a function defined there)."""
    tree = ast.parse(source)
    defined_at: dict[int, int] = {}   # a decorator -> the line its function's `def` is on
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defined_at.update((id(d), node.lineno) for d in node.decorator_list)

    def made_at_a_line(call: ast.Call) -> bool:
        return lines is None or defined_at.get(id(call)) in lines or \
            any(call.lineno <= line <= (call.end_lineno or call.lineno) for line in lines)

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and is_shard_map_call(node) and made_at_a_line(node):
            for kw in node.keywords:
                if kw.arg == "check_vma" and isinstance(kw.value, ast.Constant) \
                        and kw.value.value is False:
                    found.append(kw.value)
    changes = []
    for value in sorted(found, key=lambda v: (v.lineno, v.col_offset), reverse=True):
        source = replace(source, value, lambda _: "True")
        changes.append(Change(value.lineno, "jax.shard_map(..., check_vma=False): JAX's "
                              "manual-axis checks were off", "check_vma=True"))
    return source, changes[::-1]


# ------------------------------------------------------------------- JAX's errors -> edits


@dataclasses.dataclass
class Fix:
    """What one JAX error asks for: a Varying cast of a loop's initial carry (`path` into it)
    or of a branch's output, or the states of a Pallas kernel's outputs."""

    kind: str                    # "carry", "branch" or "pallas"
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
#: a `pallas_call` whose `out_shape` says nothing of its outputs' states (JAX 0.10, 0.12)
_PALLAS = re.compile(r"`manual_axis_type` on\s+`jax\.ShapeDtypeStruct` must not be `None`")
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


def parse_error(e: BaseException, file: str, mesh_order: Sequence[str] = (),
                manual: Sequence[str] = ()) -> list[Fix]:
    """The edits JAX's error `e` asks for, one per mismatched carry component / branch output
    JAX names ([]: not a carry / branch state mismatch); `manual`: the manual axes of the
    shard_map that raised it (default: the mesh's, `mesh_order`)."""
    text = str(e)
    line = error_line(e, file)
    fixes = []
    head = _LOOP.search(text)
    if head is not None:
        calls = ("scan", "fori_loop") if head.group(1) == "scan" else ("while_loop", "fori_loop")
        for m in _CARRY.finditer(text):
            axes = _varying(m.group("tout")) - _varying(m.group("tin"))
            if axes:
                path = _indices(m.group("path"))
                fixes.append(Fix("carry", calls, line, _ordered(axes, mesh_order), path=path))
        return fixes
    if _PALLAS.search(text):
        # the outputs vary over the manual axes (a kernel computes each device's block); JAX
        # refuses an axis the shard_map leaves to the compiler (`axis_names`)
        return [Fix("pallas", ("pallas_call",), line, tuple(manual or mesh_order))]
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
    return at.group(1), _indices(at.group(2))


def _indices(path: str) -> tuple[int, ...]:
    """`[0][1]`, a pytree path in JAX's messages -> `(0, 1)`."""
    return tuple(int(i) for i in re.findall(r"\d+", path))


def _the_call(tree: ast.AST, line: int, names: Sequence[str]) -> ast.Call | None:
    """The innermost call of one of `names` spanning `line`."""
    best = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and func_name(node) in names \
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
    if fix.kind == "pallas":
        return _pallas_states(source, tree, call, fix.axes)
    lax = lax_name(source)
    name = func_name(call) or ""
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
        new, edit = edited(source, node, lambda text: cast.replace("{}", text, 1))
        return new, Change(node.lineno, f"{name}: the initial carry{part} is Invariant and the "
                           f"body makes it Varying over {', '.join(fix.axes)}",
                           cast.replace("{}", f"init{part}", 1) + " on the initial carry",
                           edit=edit)
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
        lam, node = node, node.body
        for depth, i in enumerate(fix.path):  # a component of a literal tuple it returns
            if isinstance(node, (ast.Tuple, ast.List)) and i < len(node.elts):
                node = node.elts[i]
            elif isinstance(node, ast.Name):
                # the branch returns (part of) the loop carry it was given, as it came in:
                # the loop's initial carry is what is Invariant (a blockwise attention's
                # `lambda carry, args: (carry, None)` that skips a block)
                carry = _carry_fix(tree, call, lam, node.id, fix.path[depth:], fix.axes)
                return apply_fix(source, carry) if carry is not None else None
            else:
                return None
        new, edit = edited(source, node, lambda text: cast.replace("{}", text, 1))
    elif fix.path:
        return None  # a component of a named branch's output: not in this call's text
    else:
        simple = isinstance(node, (ast.Name, ast.Attribute))
        new, edit = edited(source, node, lambda text: "lambda *a: " + cast.replace(
            "{}", f"{text}(*a)" if simple else f"({text})(*a)", 1))
    which = fix.branch if isinstance(fix.branch, str) else f"branch {fix.branch}"
    which += "".join(f"[{i}]" for i in fix.path)
    return new, Change(node.lineno, f"{name}: the output of {which} is Invariant and the other "
                       f"branch's is Varying over {', '.join(fix.axes)}",
                       cast.replace("{}", "out", 1) + f" on the output of {which}", edit=edit)


def _pallas_states(source: str, tree: ast.AST, call: ast.Call, axes: tuple[str, ...]
                   ) -> tuple[str, Change] | None:
    """The `pallas_call` `call` with the state its kernel's outputs have with the checks on
    given (`vma_source.with_output_states`, in the function that makes the call): Varying
    over `axes`, a kernel computing each device's block."""
    # (a call outside any function: the ShapeDtypeStructs written in the call itself)
    source, count, spelled = with_output_states(source, _innermost_def(tree, call) or call, axes)
    if not count:
        return None
    return source, Change(call.lineno, f"pallas_call: its out_shape's ShapeDtypeStructs say "
                          f"nothing of the outputs' states, which JAX needs with the checks on "
                          f"({count} edited)", f"{spelled} on each")


#: each loop's body function (position, keyword) and which of its parameters is the carry
_BODY = {"scan": ((0, "f"), 0), "fori_loop": ((2, "body_fun"), 1),
         "while_loop": ((1, "body_fun"), 0)}


def _carry_fix(tree: ast.AST, call: ast.Call, lam: ast.Lambda, name: str,
               path: tuple[int, ...], axes: tuple[str, ...]) -> Fix | None:
    """The loop-carry fix for a branch `lam` of the cond / switch `call` that returns its
    parameter `name` (the component `path` of it) unchanged, when that parameter is the
    branch's operand and the operand is the carry parameter of the function a loop runs as
    its body (`def step(carry, x): ... cond(p, f, lambda c: c, carry)` and
    `lax.scan(step, init, ...)`); None when the source does not say so."""
    params = [a.arg for a in (*lam.args.posonlyargs, *lam.args.args)]
    if name not in params or lam.args.vararg is not None:
        return None
    first = 3 if func_name(call) == "cond" else 2    # cond(p, t, f, *ops), switch(i, bs, *ops)
    operands = call.args[first:]
    index = params.index(name)
    operand = operands[index] if index < len(operands) else None
    if not isinstance(operand, ast.Name):
        return None
    carry = operand.id
    body = _innermost_def(tree, call)
    if body is None:
        return None
    scope = _innermost_def(tree, body)
    inside = {id(n) for n in ast.walk(body)}
    for loop in ast.walk(scope or tree):   # the loops of the scope that defines the function
        if not (isinstance(loop, ast.Call) and func_name(loop) in _BODY) or id(loop) in inside:
            continue
        kind = func_name(loop) or ""
        where, position = _BODY[kind]
        fn = _arg(loop, *where)
        args = [a.arg for a in (*body.args.posonlyargs, *body.args.args)]
        if isinstance(fn, ast.Name) and fn.id == body.name and position < len(args) \
                and args[position] == carry:
            # (fori_loop's carry as JAX names it is (i, init): its first index is JAX's)
            return Fix("carry", (kind,), loop.lineno, axes,
                       path=(1, *path) if kind == "fori_loop" else path)
    return None


def _innermost_def(tree: ast.AST, node: ast.stmt | ast.expr) -> ast.FunctionDef | None:
    """The innermost function definition around `node` (not `node` itself)."""
    best = None
    for d in ast.walk(tree):
        if isinstance(d, ast.FunctionDef) and d is not node \
                and d.lineno <= node.lineno <= (d.end_lineno or d.lineno) \
                and (node.end_lineno or node.lineno) <= (d.end_lineno or d.lineno) \
                and (best is None or d.lineno >= best.lineno):
            best = d
    return best


#: where a traced shard_map call is: its line in the migrated module, or (a candidate's path,
#: line) in a helper module (`migrate`'s `trace`, `port --enable-vma --run`)
SiteRef = int | tuple[str, int] | None


@dataclasses.dataclass(frozen=True)
class Failed:
    """What tracing a candidate raised (`migrate`'s `trace`)."""

    error: BaseException
    #: the shard_map call whose body raised it (None: the import, or `--run`'s function)
    site: SiteRef = None
    #: that call's manual axes, in the mesh's order (what a Pallas kernel's outputs vary
    #: over; empty: unknown, the mesh's axes)
    manual: tuple[str, ...] = ()


def migrate(path: str, source: str, trace: Callable[[str], Sequence[Failed]],
            mesh_order: Sequence[str] = (), max_steps: int = 64,
            helpers: Mapping[str, str] | None = None,
            turn_on: Mapping[str, Collection[int]] | None = None,
            names: Mapping[str, str] | None = None) -> Migration:
    """Turn the checks on in `source` (the text of `path`) and fix what JAX rejects.

    `trace(candidate_path)` imports the candidate (written next to nothing: a temporary
    folder, under `path`'s file name) and returns the exceptions its shard_map bodies raise
    with the checks on (`Failed`), each with its shard_map call (the line reported when the
    traceback names none of the file's: an out_specs error, raised where JAX checks them)
    and that call's manual axes.

    `helpers` (path -> source): modules the bodies call (a kernel library next to the
    training script), written into the same folder (`vma_files.write_candidates`), which
    `trace` imports anew each time. An error is fixed in the innermost of the files its traceback
    passes through (the `cond` of a helper's function is edited in the helper). `turn_on`
    (path -> lines): only the shard_map calls made at those lines are turned on, in `path`
    and in the helpers (the calls a run reached: `port --enable-vma --run`; none of `path`'s
    when it names none there); without it, every call of `path`. `names`: where the
    candidates are written in the folder (`vma_files.layout`)."""
    source, changes = enable_checks(source, None if turn_on is None else turn_on.get(path, ()))
    sources = {path: source, **(helpers or {})}
    for p in helpers or {}:
        if turn_on is not None and turn_on.get(p):
            sources[p], turned = enable_checks(sources[p], turn_on[p])
            changes += [dataclasses.replace(c, file=p) for c in turned]
    remaining: list[Change] = []
    taken: set[tuple[str, int | None, str]] = set()
    with tempfile.TemporaryDirectory(prefix="spmdtyped-vma-") as tmp:
        for _ in range(max_steps):
            at = write_candidates(tmp, sources, names)
            back = {c: p for p, c in at.items()}
            helper_at = {c: p for c, p in back.items() if p != path}
            errors = trace(at[path])
            remaining = []
            progressed = False
            for failed in errors:
                e, site = failed.error, failed.site
                if _take_back(e, back, path, sources, changes, taken):
                    progressed = True
                    break
                for file in error_files(e, list(at.values())):
                    p = back[file]
                    for fix in parse_error(e, file, mesh_order, failed.manual):
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


#: JAX refusing a Varying cast of a value that is Varying there already
_REFUSED_CAST = re.compile(r"Unsupported pcast from=varying|pcast can only accept axis_name")


def _take_back(e: BaseException, files: Mapping[str, str], path: str, sources: dict[str, str],
               changes: list[Change], taken: set[tuple[str, int | None, str]]) -> bool:
    """Take back the migration's casts at the line where JAX refuses one (`_REFUSED_CAST`):
    an edit made later, further out, made that value Varying already (the accumulators of a
    blockwise attention's inner `scan`, once the ring's `scan` outside carries them Varying).
    `files`: candidate path -> its module's path (`path`: the migrated module's). The next
    trace asks again for those of them still needed. False when there is none to take back
    (or each was taken back once already)."""
    if not _REFUSED_CAST.search(str(e)):
        return False
    for file in error_files(e, list(files)):
        p, line = files[file], error_line(e, file)
        mine = [c for c in changes if c.edit is not None and c.line == line
                and (c.file or path) == p and (p, line, c.edit[1]) not in taken]
        undone = 0
        for c in mine:
            original, made = c.edit  # type: ignore[misc]
            starts = offsets(sources[p])
            at = sources[p].find(made, starts[line - 1]) if line is not None else -1
            if at >= 0:
                sources[p] = sources[p][:at] + original + sources[p][at + len(made):]
                taken.add((p, line, made))
                changes[:] = [d for d in changes if d is not c]
                undone += 1
        if undone:
            return True
    return False


def _unfixed(e: BaseException, file: str, site: SiteRef = None,
             helpers: Mapping[str, str] | None = None, folder: str | None = None) -> Change:
    """The report line of an error no edit fixes: at the innermost line of `file` (the
    candidate) or of a helper (`helpers`: candidate path -> the helper's own path) in its
    traceback, else at the shard_map call `site`; where it is raised in another module of
    `folder` (the original's), that module named, since the edit belongs there."""
    helpers = helpers or {}
    site_file = None
    if isinstance(site, tuple):
        site_file, site = site
        if site_file not in helpers:
            site_file = None
    change = _unfixed_at(e, file, None if site_file is not None else site)
    if change.line is None and site_file is not None:
        change.file, change.line = helpers[site_file], site
    if IN_THE_GRADIENT in getattr(e, "__notes__", ()):
        change.what += (" (in the gradient: the backward program JAX traces under jax.grad; "
                        "the forward program is accepted)")
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
