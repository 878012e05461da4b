"""Typed `shard_map`: specs -> input states; outputs checked against out_specs before JAX's check."""

from __future__ import annotations

import contextlib
import functools
import inspect
import typing
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import jax
from jax.sharding import PartitionSpec

from .. import _compat, _rules, _validate  # noqa: F401
from .._engine.check import (
    UnfollowedWarning,
    check_shard_map,
    run_checked,
    shard_map_eqn,
    signature_key,
    unfollowed,
)
from .._engine.walk import function_source, locate, raised_at
from .._errors import SpmdTypeError, error, error_context, raised_as
from .._errors.jax_messages import jax_errors

# _autodiff: importing it lets jax.grad / eqx.filter_grad differentiate typed losses in the
# bodies (`_autodiff._jax_grad_vjp`, installed once at its import)
from .._ops import autodiff as _autodiff  # noqa: F401
from .._rules.refine import shape as refine_shape
from .._typed import hints as _hints  # noqa: F401
from .._typed.array import is_typed, typeof, unwrap, vma_off, with_refinement, wrap
from . import fields as _fields
from . import specs as _specs


def spec_state(spec: Any, manual: tuple[str, ...]) -> _rules.SpmdType:
    """The state an in_spec gives its argument in a shard_map manual over `manual`."""
    part, un, red, kind = _compat.spec_parts(spec if spec is not None else PartitionSpec())
    return _rules.in_spec_type(part, un, red, manual, kind)


def is_spec_leaf(s: Any) -> bool:
    """A leaf of an in_specs/out_specs pytree: a PartitionSpec or None."""
    return s is None or isinstance(s, PartitionSpec)


def _broadcast_prefix(specs: Any, tree: Any, what: str, where: str) -> list[tuple[Any, Any]]:
    """Pair each spec with each leaf of `tree` under it (specs is a pytree prefix of tree)."""
    pairs: list[tuple[Any, Any]] = []
    try:
        jax.tree_util.tree_map(
            lambda spec, sub: pairs.extend(
                (spec, leaf) for leaf in jax.tree_util.tree_leaves(sub, is_leaf=is_typed)),
            specs, tree, is_leaf=is_spec_leaf)
    except (ValueError, TypeError) as e:
        s_def = jax.tree_util.tree_structure(specs, is_leaf=is_spec_leaf)
        t_def = jax.tree_util.tree_structure(tree, is_leaf=is_typed)
        raise error("SPMD402", f"{where}: {what} do not match the structure of the "
                    f"{'arguments' if what == 'in_specs' else 'outputs'}", op="st.shard_map",
                    details=(f"{what}: {s_def}", f"values: {t_def}", f"jax: {str(e).splitlines()[0]}"),
                    fix=f"give one PartitionSpec per {'argument' if what == 'in_specs' else 'output'}") from None
    return pairs


def shard_map(f: Callable[..., Any] | None = None, /, *, out_specs: Any = None,
              in_specs: Any = _compat.INFER, mesh: Any = None, axis_names: Any = frozenset(),
              check_vma: bool = True, strict: bool = False) -> Any:
    """Typed `jax.shard_map`: `f` receives typed values, returns typed (or raw) values.

    Same signature, defaults and semantics as `jax.shard_map` (decorator form too): `mesh`
    defaults to the mesh of `jax.set_mesh(...)`, `in_specs` to `jax.sharding.Infer` (the
    arguments' own shardings). Without `out_specs` (or without `in_specs`, when hints name
    dimensions: `st.Float[Varying["dp"], "batch/dp d"]`) the specs are derived per leaf: from
    f's hints where they name dimensions, else from the argument's own sharding on the mesh
    (an optax state, an nnx `State`, an `Any` parameter); an output whose return hint is one
    parameter's hint takes that parameter's specs (`_specs.derive`, SPMD402 where neither
    says). Inputs are typed
    from `in_specs`: `P("dp")` gives `Varying["dp"]`, `P(reduced={"tp"})` gives
    `Reduced["tp"]`, `P(unreduced={"tp"})` gives `Unreduced["tp"]`. Outputs are checked
    against `out_specs` with an SPMD error (SPMD401) before JAX's own check. The result is raw
    JAX arrays; the compiled program is the one `jax.shard_map` builds. JAX's own manual-axis
    errors are raised as SpmdTypeErrors (`_jax_errors.TABLE`).

    Every equation of the body (st.*, jnp, jax.nn, equinox / flax modules, gradients) is
    checked by the engine (`_engine.check`, the function `st.adapters.infer` runs) on the
    program JAX staged. `strict=True` also reports, as an `UnfollowedWarning` per equation
    with its line, what the engine cannot follow (a host callback, a custom call, a primitive
    with no refinement rule), and takes every `psum`/`pmean`/`psum_scatter` over an axis of a
    value its in_spec shards over that axis for a sum of slices of a global array (SPMD108; by
    default only when the out_spec shards the result over that axis again, docs/refinement.md);
    the default is quiet (docs/runtime.md).

    **Raises:** `BoundaryError` (SPMD401/402/403), `UsageError` (SPMD501 unknown axis in a spec).

    !!! Example
        ```python
        @st.shard_map(mesh=mesh, in_specs=(P("dp"), P(None, "tp")), out_specs=P("dp"))
        def layer(x: st.Varying["dp"], w: st.Varying["tp"]) -> st.Varying["dp"]:
            return st.psum(x @ w, "tp")
        ```
    """
    # every argument checked before it is used (SPMD509): a mesh axis name for mesh=, an int
    # in a spec, axis_names=5 would otherwise fail deep inside (issue 26)
    axis_names = set(_validate.shard_map_args(f, mesh, in_specs, out_specs, axis_names,
                                              "st.shard_map", infer=_compat.INFER))
    if f is None:
        return functools.partial(shard_map, out_specs=out_specs, in_specs=in_specs, mesh=mesh,
                                 axis_names=axis_names, check_vma=check_vma, strict=strict)
    if out_specs is None or (in_specs is _compat.INFER and _specs.names_dimensions(f)):
        # derived from the hints at the first call (`_specs.derive`); an omitted in_specs too
        # (JAX's Infer cannot type the pytree classes the out_specs are derived from)
        derive_in = None if in_specs is _compat.INFER else in_specs
        return _deferred(f, in_specs=derive_in, out_specs=out_specs, mesh=mesh,
                         axis_names=axis_names, check_vma=check_vma, strict=strict)
    if isinstance(axis_names, (str, tuple, list)) and not isinstance(axis_names, (set, frozenset)):
        axis_names = {axis_names} if isinstance(axis_names, str) else set(axis_names)
    name = getattr(f, "__name__", None) or getattr(getattr(f, "func", None), "__name__", repr(f))
    where = f"st.shard_map({name})"
    if mesh is not None:
        check_mesh_specs(mesh, in_specs, out_specs, axis_names, where)
    built: dict[Any, Callable[..., Any]] = {}
    #: (mesh and specs, input signature) -> the checked program (`_engine.check.run_checked`)
    checked: dict[Any, Callable[..., Any]] = {}

    def build(m: Any, specs: Any, outputs: bool = True) -> Callable[..., Any]:
        _, ret_hint = _hints_of(f)
        mesh_axes = _compat.mesh_axis_names(m)
        manual = tuple(a for a in mesh_axes if not axis_names or a in axis_names)

        def spec_type(spec: Any) -> _rules.SpmdType:
            return spec_state(spec, manual)

        def typed_input(spec: Any, raw: Any, t: _rules.SpmdType | None,
                        spec_of: dict[int, Any]) -> Any:
            # the state JAX gives the argument (or the spec's, check_vma=False), refined by the
            # spec: a dim named in it is a Shard of the global array; every input carries data
            x = wrap(raw, t)
            ndim = getattr(raw, "ndim", None)
            if ndim is not None:
                entries = _compat.spec_entries(spec if spec is not None else PartitionSpec())
                x = with_refinement(x, refine_shape.from_spec(entries, ndim, manual))
            spec_of[id(x)] = spec  # x lives in the arguments: its id stays unique meanwhile
            return x

        def typed_inputs(raw_args: tuple[Any, ...], typed: bool) -> Any:
            sp = specs if specs is not None else PartitionSpec()
            if is_spec_leaf(sp):
                sp = tuple(sp for _ in raw_args)
            spec_of: dict[int, Any] = {}
            args = jax.tree_util.tree_map(
                lambda spec, sub: jax.tree_util.tree_map(
                    lambda r: typed_input(spec, r, spec_type(spec) if typed else None, spec_of),
                    sub),
                sp, tuple(raw_args), is_leaf=is_spec_leaf)
            # the fields of dataclass / eqx.Module / NamedTuple arguments against their hints
            check_fields(args, [p for p, _ in _hints_of(f)[0]], spec_of, where)
            return args

        def body(*raw_args: Any) -> Any:
            with jax_errors(where):
                if check_vma:
                    # the state JAX gives each argument (equal to spec_type(spec): JAX is the truth)
                    out = f(*typed_inputs(raw_args, typed=False))
                else:
                    # check_vma=False: JAX types everything Invariant; spmdtyped tracks the states
                    # from the specs itself, and still checks collectives and outputs.
                    with vma_off():
                        out = f(*typed_inputs(raw_args, typed=True))
            if not outputs:  # the engine's view of a body whose outputs JAX rejects
                return jax.numpy.zeros((), "float32")
            check_return(out, ret_hint, where)
            check_outputs(out, out_specs, manual, where)
            # every typed leaf, in any pytree (registered dataclasses too): typed values are
            # pytree nodes, and JAX would rebuild them around the global outputs
            return jax.tree_util.tree_map(unwrap, out, is_leaf=is_typed)

        return _compat.shard_map(body, mesh=mesh, in_specs=in_specs,
                                 out_specs=out_specs if outputs else PartitionSpec(),
                                 axis_names=axis_names, check_vma=check_vma)

    @functools.wraps(f)
    def wrapped(*args: Any) -> Any:
        m = mesh if mesh is not None else _compat.context_mesh()
        if m is None:
            # TODO(lead): a code of its own (proposed SPMD508 "no-mesh")
            raise error("SPMD506", f"{where}: no mesh: mesh= was not given and no mesh is set",
                        op="st.shard_map",
                        fix="pass mesh=..., or call inside `with jax.set_mesh(mesh):`")
        check_not_nested(m, axis_names, where)
        raw_args = unwrap(list(args))
        specs = _compat.inferred_specs(tuple(raw_args)) if in_specs is _compat.INFER else in_specs
        if mesh is None:
            check_mesh_specs(m, specs, out_specs, axis_names, where)
        check_in_structure(specs, args, where, "st.shard_map")
        key = (id(m), str(m), repr(specs) if in_specs is _compat.INFER else None)
        manual = tuple(a for a in _compat.mesh_axis_names(m) if not axis_names or a in axis_names)
        if key not in built:
            # the hints against the specs when the function is first called with this mesh
            # and these specs (as JAX checks its specs); they do not change between calls
            check_hints(f, specs, out_specs, lambda spec: spec_state(spec, manual), manual, where)
            built[key] = build(m, specs)
        with error_context(function=name, mesh=m, manual=manual), \
                in_spec_errors(where, "st.shard_map"), jax_errors(where):
            # the engine on the program JAX staged (the function `infer` calls): whatever the
            # body is written with (jnp, jax.nn, equinox modules, ...); typed values have been
            # checked before each bind while it traced. Under check_vma=False JAX's states are
            # all Invariant: the typed values' checks, and the engine's walk of what the
            # program computes (`_engine.unchecked`: SPMD410 / SPMD411 / SPMD412)
            return run_checked(built[key], tuple(raw_args), check=lambda eqn: check(eqn, m, manual),
                               cache=checked, key=lambda: (key, signature_key(raw_args)),
                               trace=lambda thunk: located_trace(thunk, m, specs, raw_args,
                                                                 manual))

    def check(eqn: Any, m: Any, manual: tuple[str, ...]) -> None:
        got = check_shard_map(eqn, manual=manual, mesh=m, source=function_source(f), where=where,
                              strict=strict)
        if got.violations:
            raise got.violations[0]
        for prim, at, reason in unfollowed(eqn) if strict else ():
            loc = f"{at[0]}:{at[1]}" if at else "?"
            warnings.warn(f"{where} strict: {loc}: {prim}: {reason}", UnfollowedWarning,
                          stacklevel=2)

    def located_trace(thunk: Callable[[], Any], m: Any, specs: Any, raw_args: list[Any],
                      manual: tuple[str, ...]) -> Any:
        # an output that fails its out_spec is reported at its cause when the engine finds
        # one in the body (`infer` does the same), the boundary error chained
        try:
            return thunk()
        except SpmdTypeError as e:
            if e.code in ("SPMD401", "SPMD404") and e.source is None:
                cause = engine_cause(m, specs, raw_args, manual)
                if cause is not None:
                    raise raised_as(cause, e) from e
                locate(e, function_source(f))
            raise   # (any other: located by `errors_at_the_call`, around every face's call)

    def engine_cause(m: Any, specs: Any, raw_args: list[Any],
                     manual: tuple[str, ...]) -> SpmdTypeError | None:
        try:
            closed = jax.make_jaxpr(build(m, specs, outputs=False))(*raw_args)
        except Exception:  # noqa: BLE001 - the body fails for another reason: the error stands
            return None
        eqn = shard_map_eqn(closed)
        got = check_shard_map(eqn, manual=manual, mesh=m, source=function_source(f), where=where)
        return got.violations[0] if got.violations else None

    if not hasattr(f, "__name__"):  # a partial: jax.jit names the lowered module after it
        wrapped.__name__ = wrapped.__qualname__ = name
    if mesh is not None and in_specs is not _compat.INFER:
        wrapped.__wrapped_shard_map__ = build(mesh, in_specs)  # type: ignore[attr-defined]
    return errors_at_the_call(wrapped)


def errors_at_the_call(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, a face's call, whose errors all name a line (`SpmdTypeError.source`): one that
    names none (a typed value's eager check while the body traced, an argument against its
    in_spec, the mesh, a hint) is located where it was raised (`walk.raised_at`: the innermost
    user frame of its traceback, else the user's line that made the call, through `jax.jit`
    or not)."""

    @functools.wraps(fn)
    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        except SpmdTypeError as e:
            if e.source is None:
                locate(e, raised_at(e))
            raise

    return call


def check_mesh_specs(mesh: Any, in_specs: Any, out_specs: Any, axis_names: Any,
                      where: str) -> None:
    """Unknown axes in the specs or axis_names (SPMD501); Unreduced/Reduced in_specs of a
    partial-manual shard_map (SPMD403)."""
    mesh_axes = _compat.mesh_axis_names(mesh)
    manual = tuple(a for a in mesh_axes if not axis_names or a in axis_names)
    _rules.check_axes_known(tuple(axis_names), "st.shard_map(axis_names=...)", mesh_axes)
    if in_specs is not _compat.INFER:
        check_spec_axes(in_specs, mesh_axes, where, "in_specs")
        for spec in jax.tree_util.tree_leaves(in_specs, is_leaf=is_spec_leaf):
            if isinstance(spec, PartitionSpec):
                _, un, red, _ = _compat.spec_parts(spec)
                _rules.check_full_manual(un, red, manual, mesh_axes, where=where,
                                         spec=_rules.spec_text(spec))
    check_spec_axes(out_specs, mesh_axes, where, "out_specs")
    for what, specs in (("in_specs", in_specs), ("out_specs", out_specs)):
        # a partitioned axis of a spec is manual here (JAX: a raw ValueError at the call);
        # SPMD503 names it
        if specs is not _compat.INFER and axis_names:
            for spec in jax.tree_util.tree_leaves(specs, is_leaf=is_spec_leaf):
                if isinstance(spec, PartitionSpec):
                    _rules.check_axes_known(_compat.spec_parts(spec)[0], f"{where} {what}",
                                            manual, mesh_axes)
    for spec in jax.tree_util.tree_leaves(out_specs, is_leaf=is_spec_leaf):
        if isinstance(spec, PartitionSpec):
            _, un, red, _ = _compat.spec_parts(spec)
            _rules.check_full_manual(un, red, manual, mesh_axes, where=where,
                                     spec=_rules.spec_text(spec), what="out_specs")


def check_not_nested(mesh: Any, axis_names: Any, where: str) -> None:
    """SPMD409 for a shard_map called inside another one over an axis that is manual there
    already (JAX traces it and fails in the MLIR verifier or on the mesh)."""
    _, outer = _compat.current_mesh()
    mine = [a for a in _compat.mesh_axis_names(mesh) if not axis_names or a in axis_names]
    again = [a for a in mine if a in outer]
    if again:
        raise error("SPMD409", f"{where}: called inside a shard_map whose axes {list(outer)} are "
                    f"manual already; this one would make {again} manual again", op="st.shard_map",
                    axes=tuple(again), fix=f"call the function directly on the shard (it is "
                    f"already per device over {again}), or nest over the axes the outer "
                    f"shard_map leaves out of its axis_names")


@contextlib.contextmanager
def in_spec_errors(where: str, op: str) -> Iterator[None]:
    """JAX's own rejection of an in_spec (e.g. an argument not sharded as its spec says) as
    SPMD403, with the original chained; every other error passes through."""
    try:
        yield
    except SpmdTypeError:
        raise
    except (ValueError, NotImplementedError) as e:
        if not rejects_in_specs(e):
            raise
        first = str(e).split("\n")[0]
        if isinstance(e, ValueError):
            raise raised_as(error(
                "SPMD403", f"{where}: JAX rejected in_specs: {first}", op=op,
                fix="shard the argument to match its spec (jax.device_put with "
                    "NamedSharding(mesh, spec)), or use an Explicit mesh for "
                    "reduced/unreduced specs"), e) from e
        # e.g. an argument sharded over Explicit axes that its spec (None) leaves unmapped:
        # JAX closes over it and has no lowering for that
        raise raised_as(error(
            "SPMD403", f"{where}: JAX cannot honour in_specs here: {first}", op=op,
            fix="give the argument a PartitionSpec (P() replicates it) instead of None, "
                "or reshard it first"), e) from e


def rejects_in_specs(e: BaseException) -> bool:
    """Whether `e` is JAX refusing an argument against its in_spec (`in_spec_errors` raises it
    as SPMD403): JAX checks the arguments before it traces the body, so this error comes
    before any in the body."""
    first = str(e).split("\n")[0]
    if isinstance(e, ValueError):
        return "in_specs" in first
    return isinstance(e, NotImplementedError) and "shard_map" in first


def check_in_structure(in_specs: Any, args: tuple[Any, ...], where: str, op: str) -> None:
    """SPMD402 unless `in_specs` is a pytree prefix of the positional arguments."""
    if in_specs is None or is_spec_leaf(in_specs):
        return
    if isinstance(in_specs, tuple) and len(in_specs) != len(args):
        raise error("SPMD402", f"{where}: in_specs has {len(in_specs)} entries for {len(args)} "
                    f"arguments", op=op, fix="give one PartitionSpec per positional argument")
    check_spec_ranks(_broadcast_prefix(in_specs, tuple(args), "in_specs", where), "in_specs",
                     where, op)


def check_spec_ranks(pairs: list[tuple[Any, Any]], what: str, where: str, op: str) -> None:
    """SPMD402 for a spec with more entries than its value has dimensions (JAX: a raw
    ValueError, "too long to be compatible")."""
    for spec, leaf in pairs:
        ndim = getattr(leaf, "ndim", None)
        if isinstance(spec, PartitionSpec) and isinstance(ndim, int) \
                and len(_compat.spec_entries(spec)) > ndim:
            raise error("SPMD402", f"{where}: {what} entry {_rules.spec_text(spec)} names "
                        f"{len(_compat.spec_entries(spec))} dimensions, but its value has "
                        f"{ndim} (shape {tuple(getattr(leaf, 'shape', ()))})", op=op,
                        fix="one spec entry per dimension at most: P() for a scalar")


def check_outputs(out: Any, out_specs: Any, manual: tuple[str, ...], where: str,
                  types: list[_rules.SpmdType] | None = None) -> None:
    """SPMD401 unless each output leaf's state fits its out_spec (`types`: given, or read from
    the values: typed values carry theirs, raw ones are read from JAX)."""
    pairs = _broadcast_prefix(out_specs, out, "out_specs", where)
    paths: list[str] | None = None
    check_spec_ranks(pairs, "out_specs", where, "st.shard_map")
    for i, (spec, leaf) in enumerate(pairs):
        part, un, red, _kind = _compat.spec_parts(spec if spec is not None else PartitionSpec())
        t = types[i] if types is not None else typeof(leaf)
        try:
            _rules.check_out_spec(t, part, un, red, manual, where=where,
                                  spec=_rules.spec_text(spec))
        except SpmdTypeError as e:
            if paths is None:   # the output's pytree path: out[0].blocks[1].mlp.b_down
                flat, _ = jax.tree_util.tree_flatten_with_path(out, is_leaf=is_typed)
                paths = [f"out{jax.tree_util.keystr(p)}" for p, _ in flat]
            path = paths[i] if len(paths) == len(pairs) else f"output leaf {i}"
            raise error(e.code, f"{e.headline} (output {i}: {path})", axes=e.axes,
                        states=e.states, fix=e.fix, op=e.op,
                        details=(f"output {i}: {path}", *e.details)) from None


def check_return(out: Any, hint: Any, where: str) -> None:
    """SPMD401 unless the value the function returns fits its return hint (`_rules.check_return`,
    the rule the mypy plugin applies at a `return`): a single typed output under a state hint;
    raw arrays (JAX types them Invariant under check_vma=False), pytrees and other hints are
    left to the out_specs check and to beartype."""
    want = _hints.hint_type(hint)
    if want is None or not is_typed(out):
        return
    _rules.check_return(typeof(out), want, where=f"{where} (its return hint)",
                        refinement=_hints.refinement_mismatch(hint, out), hint=getattr(hint, "__name__", str(want)))


def check_fields(args: Any, names: list[str], spec_of: dict[int, Any], where: str) -> None:
    """SPMD403 when a typed value in a field of a dataclass / `eqx.Module` / NamedTuple
    argument does not fit the field's state hint (`w: Varying["tp"]`, `Shard["tp", -1]`),
    naming the class, the field and the parameter (top-level parameters: `check_hints`).
    `spec_of`: the in_spec each typed value came from, by `id`."""
    for i, arg in enumerate(args):
        pname = names[i] if i < len(names) else f"argument {i}"
        _check_node(arg, pname, pname, spec_of, where)


def _check_node(v: Any, pname: str, path: str, spec_of: dict[int, Any], where: str) -> None:
    if v is None or is_typed(v) or isinstance(v, (jax.Array, str, bytes, int, float)):
        return
    fields = _fields.field_names(v)
    if fields is not None:
        hints = _fields.field_hints(type(v))
        for n in fields:
            sub = getattr(v, n, None)
            want = _fields.state_hint(hints.get(n))
            if want is not None and is_typed(sub):
                if not isinstance(sub, want):
                    _field_error(type(v), n, sub, want, pname, f"{path}.{n}",
                                 spec_of.get(id(sub)), where)
            else:
                _check_node(sub, pname, f"{path}.{n}", spec_of, where)
    elif isinstance(v, (list, tuple)):
        for k, sub in enumerate(v):
            _check_node(sub, pname, f"{path}[{k}]", spec_of, where)
    elif isinstance(v, dict):
        for k, sub in v.items():
            _check_node(sub, pname, f"{path}[{k!r}]", spec_of, where)


def _field_error(cls: type, field: str, value: Any, want: Any, pname: str, path: str,
                 spec: Any, where: str) -> typing.NoReturn:
    have = typeof(value)
    want_t = _hints.hint_type(want)
    assert want_t is not None
    bad = sorted(a for a in have.axes | want_t.axes if have.state(a) is not want_t.state(a))
    spec_text = _rules.spec_text(spec) if isinstance(spec, PartitionSpec) else None
    got = repr(value).split("(local")[0]  # the state and refinement: Varying['tp'], Shard['tp', -1]
    raise error("SPMD403", f"{where}: field {cls.__qualname__}.{field} of parameter {pname!r} "
                f"({path}) enters the body as {got}, but its hint is {want.__qualname__} "
                f"({type(want).__instancecheck_str__(want, value)})", op="st.shard_map",
                axes=tuple(bad), states=have.states(bad),
                details=(*((f"in_spec: {spec_text} -> {have}",) if spec_text else ()),
                         f"hint: {cls.__qualname__}.{field}: {want.__qualname__}"),
                fix=f"make the spec and the field hint agree: annotate {cls.__qualname__}."
                    f"{field} as {got}, or give {path} the in_spec that gives "
                    f"{want.__qualname__}")


def check_spec_axes(specs: Any, mesh_axes: tuple[str, ...], where: str, what: str) -> None:
    for spec in jax.tree_util.tree_leaves(specs, is_leaf=is_spec_leaf):
        if isinstance(spec, PartitionSpec):
            part, un, red, _ = _compat.spec_parts(spec)
            _rules.check_axes_known(tuple(part) + tuple(sorted(un)) + tuple(sorted(red)),
                                    f"{where} {what}", mesh_axes)


def _hints_of(f: Callable[..., Any]) -> tuple[list[tuple[str, Any]], Any]:
    """(positional parameters with their hints, return hint); hints that cannot be resolved
    (forward references to names not in scope) are left out."""
    try:
        sig = inspect.signature(f)
    except (TypeError, ValueError):
        return [], None
    try:
        hints = typing.get_type_hints(f)
    except Exception:  # noqa: BLE001 - unresolvable annotations: nothing to compare
        hints = {}
    params = [(p.name, hints.get(p.name)) for p in sig.parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return params, hints.get("return")


def check_hints(f: Callable[..., Any], in_specs: Any, out_specs: Any,
                spec_type: Callable[[Any], _rules.SpmdType], manual: tuple[str, ...],
                where: str) -> None:
    """SPMD403 when an in_spec gives a parameter a state its hint rejects; SPMD401 when the
    return hint allows a state the out_spec cannot take (`Varying['dp']` through `P()`).

    Only state hints (`Varying[...]`, `Reduced[...]`, ...) next to a single PartitionSpec are
    compared; pytree specs and other hints are checked on the values, when they flow."""
    params, ret = _hints_of(f)
    if in_specs is not None:
        specs = ([in_specs] * len(params) if is_spec_leaf(in_specs)
                 else list(in_specs) if isinstance(in_specs, tuple) else [])
        for (pname, hint), spec in zip(params, specs, strict=False):
            want = _hints.hint_type(hint)
            if want is None or not is_spec_leaf(spec):
                continue
            have = spec_type(spec)
            if not issubclass(_hints.state_class(have), hint):
                bad = sorted(a for a in have.axes | want.axes if have.state(a) is not want.state(a))
                raise error("SPMD403", f"{where}: in_specs entry {_rules.spec_text(spec)} gives parameter "
                            f"{pname!r} the state {have}, but its hint is {want} "
                            f"({_hints.describe_mismatch(want, have)})", op="st.shard_map",
                            axes=tuple(bad), states=have.states(bad),
                            details=(f"in_spec: {_rules.spec_text(spec)} -> {have}", f"hint: {want}"),
                            fix=f"make the spec and the hint agree: the hint {have} for "
                                f"{_rules.spec_text(spec)}, or the spec that gives {want}")
    want_out = _hints.hint_type(ret)
    if want_out is not None and is_spec_leaf(out_specs):
        part, un, red, _kind = _compat.spec_parts(out_specs if out_specs is not None
                                                  else PartitionSpec())
        _rules.check_out_spec(want_out, part, un, red, manual,
                              where=f"{where} (its return hint {want_out})",
                              spec=_rules.spec_text(out_specs))


def _deferred(f: Callable[..., Any], *, in_specs: Any, out_specs: Any,
              **kw: Any) -> Callable[..., Any]:
    """`st.shard_map(f)` whose specs are derived from f's hints at the first call (per argument
    structure, `specs.derive`), then the `st.shard_map` of those specs."""
    name = getattr(f, "__name__", repr(f))
    cache: dict[Any, Callable[..., Any]] = {}

    @functools.wraps(f)
    def wrapped(*args: Any) -> Any:
        mesh = kw["mesh"] if kw.get("mesh") is not None else _compat.context_mesh()
        # the specs read from the arguments are part of the key: an argument placed otherwise
        # at a later call derives its own specs
        key = (jax.tree_util.tree_structure(args), repr(_compat.inferred_specs(args)),
               None if mesh is None else _specs.mesh_key(mesh))
        fn = cache.get(key)
        if fn is None:
            i, o = _specs.derive(f, args, in_specs, out_specs, f"st.shard_map({name})", mesh)
            fn = cache[key] = shard_map(f, in_specs=i, out_specs=o, **kw)
        return fn(*args)

    return errors_at_the_call(wrapped)
