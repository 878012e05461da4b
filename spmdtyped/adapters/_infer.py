"""`infer`: trace a raw per-shard function and check every equation with the strict rules."""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from .. import _compat, _rules, _surface, _validate
from .._boundary.shard_map import check_in_structure, check_mesh_specs, check_outputs, is_spec_leaf
from .._engine.check import check_shard_map, in_program_order, refine_into, shard_map_eqn
from .._engine.walk import Step, Walk, exception_source, function_source, located
from .._errors import WRONG_EITHER_WAY, SpmdTypeError
from .._errors.jax_messages import translate
from .._rules import SpmdType
from ._conventions import fn_name, manual_axes, resolve_in_specs, resolve_mesh
from ._tracebacks import collective_call


@dataclasses.dataclass
class InferReport:
    """What `infer` found.

    **Attributes:**

    - `ok`: no violations.
    - `violations`: `SpmdTypeError`s, each with `.code`, `.source` (`"file:line"` of the
      user's code), `.file` and `.line`.
    - `in_types` / `out_types`: the `SpmdType` of each argument / output leaf, in flattening
      order (the outputs as the function returned them, before shard_map's boundary casts).
    - `signature`: the typed `def` line to paste, e.g.
      `def f(x: Varying["dp"], w: Varying["tp"]) -> Varying["dp"]:`.
    - `steps`: every checked equation (`Step`: file, line, primitive, states in and out).
    - `mismatches`: equations where the rule table's prediction differs from JAX's state
      without a violation (a gap in the rule table; empty for every program we know).
    - `jaxpr`: the traced `ClosedJaxpr` (None when tracing failed).
    """

    ok: bool
    violations: list[SpmdTypeError]
    in_types: list[SpmdType]
    out_types: list[SpmdType]
    signature: str
    steps: list[Step]
    mismatches: list[str]
    jaxpr: Any = None
    mesh_axes: tuple[str, ...] = ()
    #: for code written with `check_vma=False` (`infer(..., check_vma=False)`): what turning
    #: the checks on changes, one line per violation (`file:line: CODE: ...`); else empty
    check_vma_changes: list[str] = dataclasses.field(default_factory=list)

    def listing(self, *, file: str | None = None, casts: bool = False) -> list[str]:
        """The per-line type listing: `file:line  op: (in states) -> out states`, in order
        (`casts=True` also lists the pvary casts JAX inserted by itself)."""
        out = []
        for s in self.steps:
            if (file is not None and s.file != file) or (s.auto and not casts):
                continue
            loc = f"{os.path.basename(s.file)}:{s.line}" if s.file else "<jax>"
            out.append(f"{loc:>20s}  {s.describe()}")
        return out

    def __str__(self) -> str:
        lines = [self.signature]
        if self.violations:
            lines.append(f"{len(self.violations)} violation(s):")
            lines += [f"  {getattr(v, 'source', '?')}: {v.code} {v.headline}"
                      for v in self.violations]
        else:
            lines.append("ok: no violations")
        if self.check_vma_changes:
            lines.append("turning check_vma on changes:")
            lines += [f"  {c}" for c in self.check_vma_changes]
        return "\n".join(lines)


# ------------------------------------------------------------------- hints as source text


def hint(t: SpmdType, order: Sequence[str] | None = None) -> str:
    """The annotation for a state, e.g. `Varying["dp", "tp"]` or
    `Typed[Varying["dp"], Reduced["tp"]]` (axes in mesh order): `_rules.hint_text`."""
    return _rules.hint_text(t, order)


def _tree_hint(tree: Any, types: Sequence[SpmdType], order: Sequence[str]) -> str:
    """Annotation for a pytree whose leaves (in order) have `types`."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    if len(leaves) == 1 and jax.tree_util.treedef_is_leaf(treedef):
        return hint(types[0], order)
    if isinstance(tree, (tuple, list)) and not hasattr(tree, "_fields"):
        parts, i = [], 0
        for sub in tree:
            n = len(jax.tree_util.tree_leaves(sub))
            parts.append(_tree_hint(sub, types[i:i + n], order))
            i += n
        return f"tuple[{', '.join(parts)}]" if isinstance(tree, tuple) else \
            f"list[{parts[0] if len(set(parts)) == 1 else 'Any'}]"
    kinds = {hint(t, order) for t in types}
    return kinds.pop() if len(kinds) == 1 else "Any"


def signature_line(f: Callable[..., Any], args: Sequence[Any], in_types: Sequence[SpmdType],
                   out_tree: Any, out_types: Sequence[SpmdType], order: Sequence[str]) -> str:
    """`def name(p: Hint, ...) -> Hint:` for `f`'s positional parameters."""
    name = fn_name(f)
    try:
        params = [p.name for p in inspect.signature(f).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    params += [f"arg{i}" for i in range(len(params), len(args))]
    parts, i = [], 0
    for pname, a in zip(params, args, strict=False):
        n = len(jax.tree_util.tree_leaves(a))
        parts.append(f"{pname}: {_tree_hint(a, in_types[i:i + n], order)}")
        i += n
    ret = _tree_hint(out_tree, out_types, order) if out_types else "None"
    return f"def {name}({', '.join(parts)}) -> {ret}:"


# ------------------------------------------------------------------- tracing


def abstract_args(args: Sequence[Any], in_specs: Any, mesh: Any) -> tuple[Any, ...]:
    """Global arrays or ShapeDtypeStructs -> ShapeDtypeStructs sharded as their in_specs
    say (tracing needs no data; an Explicit mesh needs the shardings to match)."""
    specs = in_specs if isinstance(in_specs, tuple) else (in_specs,) * len(args)

    def one(spec: Any, sub: Any) -> Any:
        if spec is _compat.INFER:   # (JAX reads the spec off the argument's own sharding)
            return sub
        spec = PartitionSpec() if spec is None else spec
        sharding = NamedSharding(mesh, spec)
        # a leaf that is no array (an in_spec of None: any Python object) is passed as is
        return jax.tree_util.tree_map(
            lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)
            if hasattr(leaf, "shape") and hasattr(leaf, "dtype") else leaf, sub)

    return tuple(jax.tree_util.tree_map(one, specs, tuple(args), is_leaf=is_spec_leaf))


def infer(f: Callable[..., Any], *args: Any, out_specs: Any, in_specs: Any = _compat.INFER,
          mesh: Any = None, axis_names: Any = frozenset(), check_vma: bool = True,
          strict: bool = False) -> InferReport:
    """Trace a raw per-shard function and check it with the strict rules, without editing it.

    `f` is traced under `jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs)`
    to a jaxpr, and every equation, including those inside scan/while/cond/jit/remat/
    custom_jvp/custom_vjp, is checked with `_rules` (collectives with `axis_op`, elementwise
    and structural primitives with `combine`/`unary` through `_rules.PRIMITIVES`). This finds
    the programs JAX accepts and computes wrongly: a double psum or a pmean of gradients
    that are already summed (JAX auto-inserts a `pvary`: SPMD103), cumsum/`**`/flip of an
    Unreduced value (SPMD202), a Varying output declared unreduced on jax 0.10 (SPMD401).
    If JAX rejects the program, its manual-axis error is translated (`_jax_errors.TABLE`) and
    the body traced again with its outputs checked against `out_specs` (an unknown axis named
    from the collective's call: SPMD501), so the report carries spmdtyped's code instead of
    JAX's exception: no manual-axis error escapes.

    **Arguments:**

    - `f`: the per-shard function (raw JAX code; a `functools.partial` or jitted one too).
    - `*args`: global arrays or `jax.ShapeDtypeStruct`s (only shapes and dtypes are used).
    - `out_specs`, `in_specs`, `mesh`, `axis_names`: as for `jax.shard_map`, with its defaults
      (`mesh` from `jax.set_mesh`, `in_specs` inferred from the arguments' shardings).
    - `check_vma`: `infer` always traces with the checks on; with `check_vma=False` (code
      written for it) the report's `check_vma_changes` lists what turning them on changes,
      and the program that runs unchecked is walked too: a gradient its autodiff leaves
      unsummed is SPMD410, one it sums twice SPMD411, a cotangent it leaves partial
      SPMD412 (`_engine.unchecked`).
    - `strict`: as `st.shard_map(..., strict=True)`: every psum of a value its in_spec shards
      over the summed axis is SPMD108 (by default only where the out_spec or a gradient tells
      a slice of a global array from a stack of per-device terms; docs/refinement.md).

    **Returns:** an `InferReport` (`ok`, `violations`, `in_types`, `out_types`, `signature`,
    `steps`, `mismatches`).

    **Raises:** JAX's own exception when the program fails for a reason spmdtyped has no
    code for (e.g. a shape error).

    !!! Example
        ```python
        with jax.set_mesh(mesh):
            rep = st.adapters.infer(mlp, x, w1, w2, in_specs=(P("dp"), P(None, "tp"), P("tp")),
                                    out_specs=P("dp"))
        print(rep.signature)   # def mlp(x: Varying["dp"], w1: Varying["tp"], ...) -> Varying["dp"]:
        for v in rep.violations:
            print(v.source, v.code)
        ```
    """
    _validate.callable_arg(f, "st.adapters.infer")
    _validate.given_specs(out_specs, "st.adapters.infer")
    axis_names = set(_validate.shard_map_args(f, mesh, in_specs, out_specs, axis_names,
                                              "st.adapters.infer", infer=_compat.INFER))
    where = f"infer({fn_name(f)})"
    mesh = resolve_mesh(mesh, where, concrete=True)
    specs = resolve_in_specs(in_specs, tuple(args))
    check_mesh_specs(mesh, specs, out_specs, axis_names, where)
    check_in_structure(specs, tuple(args), where, "st.adapters.infer")
    try:
        rep = run_infer(f, args, mesh=mesh, in_specs=specs,
                        out_specs=out_specs, axis_names=axis_names, where=where, strict=strict)
    except Exception as e:
        if check_vma:
            raise
        # code written for check_vma=False that JAX cannot trace with the checks on, for a
        # reason spmdtyped has no code for (a custom_vjp whose backward drops a varying
        # axis): the program that runs is still walked
        rep = _unanalysed(f, args, specs, mesh, axis_names)
        rep.check_vma_changes = [f"?: with check_vma=True, JAX rejects the program: "
                                 f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"]
    else:
        if check_vma:
            return rep
        # the program was written for check_vma=False: each strict-rule violation of its
        # check_vma=True trace is a line whose meaning changes when the checks are turned on
        # (typically an explicit psum of a gradient JAX now sums itself: a double sum)
        rep.check_vma_changes = [vma_change(v) for v in rep.violations]
    found, wrong = _walk_unchecked(f, args, mesh=mesh, in_specs=specs, out_specs=out_specs,
                                   axis_names=axis_names, where=where)
    # the Shard / Partial bugs of the program that runs that its checked trace did not show
    # (JAX rejected it, or its states there hid them): wrong either way, listed as such
    seen = {(v.code, v.file, v.line) for v in rep.violations}
    for v in wrong:
        if (v.code, v.file, v.line) not in seen:
            seen.add((v.code, v.file, v.line))
            rep.violations.append(v)
            rep.check_vma_changes.append(vma_change(v))
    rep.violations.extend(found)
    rep.ok = not rep.violations
    return rep


def _unanalysed(f: Callable[..., Any], args: Sequence[Any], in_specs: Any, mesh: Any,
                axis_names: Any) -> InferReport:
    """The report of a body whose checked trace failed: its arguments' states from the
    specs, no violation of its own."""
    spec_types = _arg_types(in_specs, abstract_args(args, in_specs, mesh),
                            manual_axes(mesh, axis_names))
    return _untraced(f, args, spec_types, [], _compat.mesh_axis_names(mesh))


def _arg_types(in_specs: Any, sds: tuple[Any, ...], manual: Any) -> list[SpmdType]:
    """Each flat argument's state (`sds`: the abstract arguments), read from its in_spec."""
    return [_spec_type(s, manual) for s in _flat_specs(in_specs, sds)]


def _untraced(f: Callable[..., Any], args: Sequence[Any], spec_types: list[SpmdType],
              violations: list[SpmdTypeError], order: Sequence[str]) -> InferReport:
    """The report of a body with no checked trace: the arguments' states, no outputs."""
    sig = signature_line(f, args, spec_types, None, [], order).replace("-> None:", "-> ...:")
    return InferReport(not violations, violations, spec_types, [], sig, [], [], None, tuple(order))


def _walk_unchecked(f: Callable[..., Any], args: Sequence[Any], *, mesh: Any,
                    in_specs: Any, out_specs: Any, axis_names: Any,
                    where: str) -> tuple[list[SpmdTypeError], list[SpmdTypeError]]:
    """The engine's violations of the program `jax.shard_map(f, check_vma=False)` runs
    (`_engine.unchecked`: a gradient its autodiff leaves unsummed or sums twice, a cotangent
    it leaves partial: SPMD410 / SPMD411 / SPMD412), and its Shard / Partial findings (the
    refinement walk of that program, `Checked.wrong`: what the faces warn); none
    when JAX cannot trace it (the checked trace's report says why)."""
    try:
        closed = jax.make_jaxpr(_compat.shard_map(
            f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, axis_names=axis_names,
            check_vma=False))(*abstract_args(args, in_specs, mesh))
    except Exception:  # noqa: BLE001 - e.g. Python control flow on per-device values
        return [], []
    eqn = shard_map_eqn(closed)
    if eqn is None:
        return [], []
    got = check_shard_map(eqn, manual=manual_axes(mesh, axis_names), mesh=mesh,
                          source=function_source(f), where=where)
    return got.violations, got.wrong


def vma_change(v: SpmdTypeError) -> str:
    """One violation of a `check_vma=False` body's checked trace, as `infer`'s
    `check_vma_changes` and `typed_shard_map(check_vma=False)`'s warnings print it. A Shard /
    Partial code (`WRONG_EITHER_WAY`: a bias added before the psum) says that the program is
    wrong as it runs, not only once the checks are on."""
    when = ("wrong with check_vma=False too (JAX computes the same numbers either way)"
            if v.code in WRONG_EITHER_WAY else "with check_vma=True")
    return f"{getattr(v, 'source', None) or '?'}: {v.code}: {when}, {v.headline}"


class CheckVmaWarning(UserWarning):
    """What `typed_shard_map(..., check_vma=False)` (and `checking(step)`) finds in a body JAX
    runs unchecked.

    The program that runs is `jax.shard_map(f, check_vma=False)`'s, unchanged; its body is
    also traced with the checks on (as `infer(..., check_vma=False)` does), the Shard /
    Partial rules walk the program that runs (each value's state read from what it computes:
    JAX rejects many such bodies with the checks on), and each finding is warned once, marked
    `check_vma=False:`, with its code and line: a bug the checks would
    catch, a Shard / Partial bug the program has as it runs (a bias added before the psum:
    "wrong with check_vma=False too"), or a line whose meaning changes when they are turned
    on (an explicit `psum` of a gradient JAX then sums itself).

    **Attributes:** `error` (the `SpmdTypeError`), `code`, `source` (`"file:line"`), `file`,
    `line`. Made from its text alone (as pytest-xdist rebuilds a warning from its `args`),
    `error` is None and the others are read from the text.
    """

    def __init__(self, message: SpmdTypeError | str) -> None:
        error = message if isinstance(message, SpmdTypeError) else None
        text = f"check_vma=False: {vma_change(error)}" if error is not None else str(message)
        super().__init__(text)  # args: the text only, so that the warning can be rebuilt
        self.error = error
        m = re.match(r"check_vma=False: (?:((.*):(\d+))|\?): (SPMD\d{3}): ", text)
        self.code = error.code if error is not None else (m.group(4) if m else None)
        self.source = error.source if error is not None else (m.group(1) if m else None)
        self.file = error.file if error is not None else (m.group(2) if m else None)
        line = error.line if error is not None else (m.group(3) if m else None)
        self.line = int(line) if line is not None else None


def _trace_discarding_outputs(f: Callable[..., Any], sds: Sequence[Any], *, mesh: Any,
                             in_specs: Any, axis_names: Any) -> Any | None:
    """The jaxpr of `f`'s body when JAX rejects the program at its out_specs (e.g. a loss
    that still varies, class 8): traced with the outputs replaced by a replicated zero, so
    the refinement walk still sees every equation. None when even that fails."""
    def body(*a: Any) -> Any:
        f(*a)
        return jax.numpy.zeros((), jax.numpy.float32)

    try:
        return jax.make_jaxpr(_compat.shard_map(body, mesh=mesh, in_specs=in_specs,
                                                out_specs=PartitionSpec(),
                                                axis_names=axis_names, check_vma=True))(*sds)
    except Exception:  # noqa: BLE001 - a program JAX rejects for another reason: nothing to walk
        return None


def unknown_axis(e: BaseException, mesh: Any, manual: Sequence[str]) -> SpmdTypeError | None:
    """SPMD501 / SPMD503 at the user's line when `e` (caught inside the traced body, before
    JAX filters its traceback) was raised in a `jax.lax` collective over an axis the mesh
    lacks or that is not manual (jax 0.10 raises a bare AssertionError there)."""
    call = collective_call(e, _surface.LAX_NAMES)
    if call is None:
        return None
    op, axis_name = call
    try:
        _rules.check_axes_known(_rules.normalize_axes(axis_name, f"jax.lax.{op}"),
                                f"jax.lax.{op}", manual, _compat.mesh_axis_names(mesh))
    except SpmdTypeError as err:
        where = exception_source(e)
        return located(err, where) if where is not None else err
    return None


def run_infer(f: Callable[..., Any], args: Sequence[Any], *, mesh: Any, in_specs: Any,
              out_specs: Any, axis_names: Any, where: str, strict: bool = False) -> InferReport:
    """`infer`, with `where` naming the API in boundary messages (`typed_shard_map(f)`)."""
    order = _compat.mesh_axis_names(mesh)
    manual = manual_axes(mesh, axis_names)
    sds = abstract_args(args, in_specs, mesh)
    spec_types = _arg_types(in_specs, sds, manual)
    smapped = _compat.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                axis_names=axis_names, check_vma=True)
    try:
        closed, out_shape = jax.make_jaxpr(smapped, return_shape=True)(*sds)
    except SpmdTypeError as e:  # f already uses spmdtyped.lax / st.*
        return _failed(f, args, spec_types, e, order)
    except Exception as jax_error:  # noqa: BLE001 - JAX rejected it: find spmdtyped's code
        def rejected(rep: InferReport) -> InferReport:
            # the refinement walk still sees every equation when only the outputs failed
            refined = _trace_discarding_outputs(f, sds, mesh=mesh, in_specs=in_specs,
                                               axis_names=axis_names)
            eqn = shard_map_eqn(refined) if refined is not None else None
            if eqn is not None:
                extra = Walk(record_steps=False)
                refine_into(extra, eqn, manual, mesh, strict=strict)
                rep.violations.extend(extra.violations)
                rep.mismatches.extend(extra.mismatches)
                inner = eqn.params["jaxpr"]
                rep.violations[:] = in_program_order(getattr(inner, "jaxpr", inner),
                                                     rep.violations, function_source(f))
            return rep

        def body(*a: Any) -> Any:
            try:
                out = f(*a)
            except SpmdTypeError:
                raise
            except Exception as e:  # an axis the mesh lacks in a raw collective: SPMD501
                unknown = unknown_axis(e, mesh, manual)
                if unknown is None:
                    raise
                raise unknown from e
            check_outputs(out, out_specs, _compat.current_mesh()[1], where)
            return out

        functools_wraps(body, f)
        try:
            jax.make_jaxpr(_compat.shard_map(body, mesh=mesh, in_specs=in_specs,
                                             out_specs=out_specs, axis_names=axis_names,
                                             check_vma=True))(*sds)
        except SpmdTypeError as e:
            return rejected(_failed(f, args, spec_types, e, order))
        except Exception:  # noqa: BLE001, S110 - the first error is translated
            pass
        translated = translate(jax_error, where)
        if translated is None:
            raise
        translated.__cause__ = jax_error
        return rejected(_failed(f, args, spec_types, translated, order))
    return walk_traced(closed, out_shape, f, args, mesh=mesh, axis_names=axis_names, where=where,
                       strict=strict)


def walk_traced(closed: Any, out_shape: Any, f: Callable[..., Any], args: Sequence[Any], *,
                mesh: Any, axis_names: Any, where: str, steps: bool = True,
                strict: bool = False) -> InferReport:
    """Check the traced `jax.shard_map(f)` program (`closed`: a ClosedJaxpr with one shard_map
    equation, or that equation itself, as staged in the caller's trace) with the engine
    (`_engine.check.check_shard_map`, the function every runtime face calls)."""
    order = _compat.mesh_axis_names(mesh)
    manual = manual_axes(mesh, axis_names)
    eqn = shard_map_eqn(closed)
    if eqn is None:  # pragma: no cover - jax.shard_map always leaves one equation
        raise RuntimeError("infer: no shard_map equation in the traced program")
    got = check_shard_map(eqn, manual=manual, mesh=mesh, source=function_source(f), where=where,
                          steps=steps, strict=strict)
    walk = got.walk
    sig = signature_line(f, args, got.in_types, out_shape, got.out_types, order)
    return InferReport(not walk.violations, walk.violations, got.in_types, got.out_types, sig,
                       walk.steps, walk.mismatches, closed if closed is not eqn else None, order)


def functools_wraps(body: Callable[..., Any], f: Callable[..., Any]) -> None:
    body.__name__ = body.__qualname__ = fn_name(f)


def _failed(f: Callable[..., Any], args: Sequence[Any], spec_types: list[SpmdType],
            e: SpmdTypeError, order: Sequence[str]) -> InferReport:
    where = exception_source(e)
    if e.code.startswith("SPMD4") and function_source(f) is not None:
        # a boundary error belongs to the function, not to the line that traced it
        where = function_source(f)
    return _untraced(f, args, spec_types, [located(e, where)], order)


def _flat_specs(in_specs: Any, sds: tuple[Any, ...]) -> list[Any]:
    specs = in_specs if isinstance(in_specs, tuple) else (in_specs,) * len(sds)
    out: list[Any] = []
    jax.tree_util.tree_map(lambda s, sub: out.extend([s] * len(jax.tree_util.tree_leaves(sub))),
                           specs, sds, is_leaf=is_spec_leaf)
    return out


def _spec_type(spec: Any, manual: Sequence[str]) -> SpmdType:
    part, un, red, kind = _compat.spec_parts(spec if spec is not None else PartitionSpec())
    return _rules.in_spec_type(part, un, red, manual, kind)
