"""PartitionSpecs derived from hints that name dimensions (`st.shard_map` without specs).

A parameter hinted `st.Float[Varying["dp"], "batch/dp d"]` says everything its in_spec says:
dimension 0 is partitioned over `dp` -> `P("dp", None)`; so does `st.Shard["tp", -1]` (the last
dimension over `tp`: `P(None, "tp")` for a matrix). An `Invariant` hint is `P()`;
`Reduced`/`Unreduced` axes go to `P(reduced=...)` / `P(unreduced=...)`. A parameter whose
hint is a class (an `eqx.Module`, a dataclass, a NamedTuple) gets one spec per leaf, read from
the annotation of each field on the path to the leaf, so a whole parameter pytree is derived
from its class. Where a hint names no dimensions (`Any`, an optax state, a field hinted
`jax.Array`, a bare `Varying["dp"]`), the leaves' specs are read from the argument itself, as
JAX's `Infer` does: a global array's `NamedSharding` on the mesh, or a traced one's sharding
type (Explicit axes). Out specs come from the return hint the same way; a return hint that is
exactly one parameter's hint (the updated model, the new optimiser state) reuses that
parameter's spec tree. Where a spec cannot be derived (an argument on one device or on an Auto
mesh under jit, a layout the hint leaves ambiguous, a return hint no parameter has, or two
parameters with different specs have), SPMD402 names the parameter and the path.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import PartitionSpec

from .. import _compat
from .._errors import error
from .._rules.refine import Shard
from .._typed.hints import hint_type, is_state_class
from .fields import evaluated, field_hints, field_names, strip

_DERIVED_FIX = ('name the partitioned dimensions in the hint, e.g. '
                'x: st.Float[Varying["dp"], "batch/dp d"], or pass the argument as a global '
                'array sharded on the mesh (jax.device_put(x, NamedSharding(mesh, spec))), '
                'or pass in_specs/out_specs')


class _NotDerivable(Exception):
    pass


class _NoInference(_NotDerivable):
    """A spec the argument's sharding cannot stand in for (not retried from the argument, nor
    higher up the tree): neither the hint nor the argument says it, or the hint says a layout
    that is ambiguous or impossible."""


def _hint_spec(hint: Any, ndim: int | None, where: str) -> PartitionSpec:
    """The spec of one array hint (a state class, or a `st.Float[state, dims]` hint)."""
    axes: tuple[tuple[str, ...], ...] = ()
    state = hint
    if hasattr(hint, "_axes") and hasattr(hint, "_state"):  # st.Float[...] (_jaxtyping)
        axes, state = hint._axes, hint._state
    if not is_state_class(state):
        raise _NotDerivable(f"{where}: the hint {_name(hint)} is not a state hint")
    t = hint_type(state)
    if t is None:
        raise _NotDerivable(f"{where}: the hint {_name(hint)} names no state")
    if not axes:  # `Shard["tp", -1]`, `Typed[Shard["dp", 0], Shard["tp", 1]]`: the dims
        axes = _shard_dims(getattr(state, "_refinement", None), ndim, _name(hint), where)
    partitioned = {a for part in axes for a in part}
    missing = sorted(t.varying - partitioned)
    if missing:
        raise _NotDerivable(f"{where}: the hint {_name(hint)} is Varying over {missing[0]!r} but "
                            f"names no dimension partitioned over it")
    entries: list[Any] = [None if not p else (p[0] if len(p) == 1 else p) for p in axes]
    if ndim is not None:
        entries = entries[:ndim]
    while entries and entries[-1] is None:
        entries.pop()
    kw: dict[str, Any] = {}
    if t.unreduced:
        kw["unreduced"] = set(t.unreduced)
    if t.reduced:
        kw["reduced"] = set(t.reduced)
    return PartitionSpec(*entries, **kw)


def _shard_dims(ref: Any, ndim: int | None, name: str, where: str) -> tuple[tuple[str, ...], ...]:
    """The axes partitioning each dimension, read from the Shard refinements of a hint."""
    by_dim: dict[int, list[str]] = {}
    for axis, kind in getattr(ref, "items", ()):
        if not isinstance(kind, Shard):
            continue  # Partial / Rep: no layout (reported as "names no dimension" below)
        d = kind.dim
        if d < 0:
            if ndim is None:
                raise _NoInference(f"{where}: the hint {name} counts its dim from the right, "
                                    f"which needs the value's rank (write the dim from the left)")
            d += ndim
        if not 0 <= d < (ndim if ndim is not None else d + 1):
            raise _NoInference(f"{where}: the hint {name} shards dim {kind.dim} of a value of "
                                f"rank {ndim}")
        by_dim.setdefault(d, []).append(axis)
    for d, names in by_dim.items():
        if len(names) > 1:  # their order (the layout) is not in the hint
            raise _NoInference(f"{where}: the hint {name} shards dim {d} over {sorted(names)}, "
                                f"in an order the hint does not say")
    n = max(by_dim, default=-1) + 1
    return tuple(tuple(by_dim.get(d, ())) for d in range(n))


def _name(hint: Any) -> str:
    return getattr(hint, "__qualname__", None) or repr(hint)


def _tree_specs(hint: Any, value: Any, where: str, mesh: Any = None) -> Any:
    """A spec for every leaf of `value`, read from `hint` and the field hints under it; where
    a hint names no dimensions (`Any`, `jax.Array`, `Varying["dp"]`, a field without a hint),
    from the argument's own sharding (`_value_specs`, what JAX's `Infer` reads)."""
    try:
        return _hinted_specs(hint, value, where, mesh)
    except _NoInference:
        raise
    except _NotDerivable as e:
        return _value_specs(value, where, mesh, str(e))


def mesh_key(m: Any) -> tuple[tuple[str, int], ...]:
    return tuple(dict(m.shape).items())


def _value_specs(value: Any, where: str, mesh: Any, why: str) -> Any:
    """The spec of every leaf of `value` read from the leaf itself, as JAX's `Infer` does
    (`_compat.inferred_specs`), where that is what the leaf will be: a global array with a
    `NamedSharding` on `mesh`, a traced one whose sharding is in its type (an Explicit mesh),
    or a value not placed on any mesh (an uncommitted array, a scalar: replicated, `P()`).
    Anything else (an array committed to one device, or another mesh; a tracer on an Auto mesh,
    whose sharding is not known while tracing) raises `_NoInference` naming `why` the hint
    did not say it either."""
    def spec(leaf: Any, path: str) -> PartitionSpec:
        if isinstance(leaf, jax.core.Tracer):
            sharding = jax.typeof(leaf).sharding
            m = getattr(sharding, "mesh", None)
            if m is None or m.empty:
                return PartitionSpec()
            types = getattr(m, "axis_types", ())
            if (mesh is None or mesh_key(m) == mesh_key(mesh)) and types and all(
                    "Explicit" in str(t) for t in types):
                return _compat.inferred_specs((leaf,))[0]
            bad = "Auto axes, whose sharding is not known while tracing" if mesh is None or \
                mesh_key(m) == mesh_key(mesh) else f"another mesh {dict(m.shape)}"
            raise _NoInference(f"{why}; and the argument at {path} is traced on a mesh with "
                               f"{bad} (use an Explicit mesh, as jax.make_mesh makes by default)")
        if isinstance(leaf, jax.Array):
            sharding = leaf.sharding
            if isinstance(sharding, jax.sharding.NamedSharding) and (
                    mesh is None or mesh_key(sharding.mesh) == mesh_key(mesh)):
                return _compat.inferred_specs((leaf,))[0]
            if not leaf.committed:
                return PartitionSpec()
            raise _NoInference(f"{why}; and the argument at {path} is not a global array "
                               f"on the mesh (its sharding: {sharding}); device_put it with a "
                               f"NamedSharding on the mesh")
        return PartitionSpec()  # numpy arrays, Python scalars: replicated, as JAX places them

    leaves, treedef = jax.tree_util.tree_flatten_with_path(value)
    return jax.tree_util.tree_unflatten(
        treedef, [spec(leaf, where + jax.tree_util.keystr(kp)) for kp, leaf in leaves])


_NO_HINT = object()


def _hinted_specs(hint: Any, value: Any, where: str, mesh: Any) -> Any:
    if hint is _NO_HINT:
        raise _NotDerivable(f"{where}: it has no hint")
    hint = strip(hint)
    if is_state_class(hint) or hasattr(hint, "_axes"):
        return _hint_spec(hint, getattr(value, "ndim", None), where)
    origin = typing.get_origin(hint)
    if origin in (tuple, list) and isinstance(value, (tuple, list)):
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            args = (args[0],) * len(value)
        if len(args) != len(value):
            raise _NotDerivable(f"{where}: the hint has {len(args)} entries, the value {len(value)}")
        out = [_tree_specs(h, v, f"{where}[{i}]", mesh) for i, (h, v) in enumerate(zip(args, value, strict=True))]
        return type(value)(*out) if hasattr(value, "_fields") else type(value)(out)
    if origin is dict and isinstance(value, dict):
        (_k, vh) = typing.get_args(hint)
        return {k: _tree_specs(vh, v, f"{where}[{k!r}]", mesh) for k, v in value.items()}
    names = field_names(value)
    if isinstance(hint, type) and hint is not Any and isinstance(value, hint) and names is not None:
        fields = field_hints(type(value))
        specs = {}
        for n in names:
            specs[n] = _tree_specs(fields.get(n, _NO_HINT), getattr(value, n), f"{where}.{n}", mesh)
        return _rebuild(value, specs)
    raise _NotDerivable(f"{where}: the hint {_name(hint)} names no state or dimensions")


def _rebuild(value: Any, specs: dict[str, Any]) -> Any:
    """A copy of `value` (a dataclass, eqx.Module or NamedTuple) with its fields replaced."""
    if hasattr(value, "_fields"):
        return type(value)(**specs)
    obj = object.__new__(type(value))
    for n, s in specs.items():
        object.__setattr__(obj, n, s)
    return obj


def _out_specs(hint: Any, by_hint: dict[Any, Any], params_of: dict[Any, list[str]],
               where: str) -> Any:
    hint = strip(hint)
    if is_state_class(hint) or hasattr(hint, "_axes"):
        try:
            return _hint_spec(hint, None, where)
        except _NotDerivable:
            if _key(hint) not in by_hint:
                raise
    elif typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        return tuple(_out_specs(h, by_hint, params_of, f"{where}[{i}]") for i, h in enumerate(args))
    k = _key(hint)
    if k is not None and k in by_hint:
        if by_hint[k] is _AMBIGUOUS:
            names = ", ".join(repr(n) for n in params_of[k])
            raise _NotDerivable(f"{where}: the return hint {_name(hint)} is the hint of the "
                                f"parameters {names}, whose specs differ: which one it returns "
                                f"is not said (give it a hint naming its dimensions, or pass "
                                f"out_specs)")
        return by_hint[k]
    raise _NotDerivable(f"{where}: the return hint {_name(hint)} names no state or dimensions, "
                        f"and no parameter has this hint (an output hinted as a parameter "
                        f"takes that parameter's specs: annotate it so, or pass out_specs)")


_AMBIGUOUS = object()


def _key(hint: Any) -> Any:
    """`hint` as a dict key (None when it cannot be one)."""
    try:
        hash(hint)
    except TypeError:
        return None
    return hint


def _function_hints(f: Callable[..., Any], where: str) -> dict[str, Any]:
    """f's hints, resolved; a hint with a forward reference inside it that does not resolve
    (`optax.OptState`: `ArrayTree` is a name of chex) is kept as the object it evaluates to."""
    try:
        return typing.get_type_hints(f, include_extras=True)
    except Exception as e:  # noqa: BLE001 - evaluate hint by hint, without the inner references
        first = e
    out, missing = evaluated(getattr(f, "__annotations__", {}),
                              dict(getattr(inspect.unwrap(f), "__globals__", {})))
    if missing:
        raise error("SPMD402", f"{where}: cannot read the hints to derive specs ({first})",
                    op="st.shard_map", fix=_DERIVED_FIX) from None
    return out


def derive(f: Callable[..., Any], args: tuple[Any, ...], in_specs: Any, out_specs: Any,
           where: str, mesh: Any = None) -> tuple[Any, Any]:
    """(in_specs, out_specs) for `f(*args)`: the given ones, else derived from f's hints, and
    where a hint names no dimensions (`Any`, an optax state, a field hinted `jax.Array`) from
    the argument's own sharding on `mesh` (`_value_specs`). An output whose hint is exactly a
    parameter's hint (the updated model, the new optimiser state) takes that parameter's specs;
    the outputs are then checked against them leaf by leaf (the structure: SPMD402; the states:
    SPMD401) when the function is traced."""
    hints = _function_hints(f, where)
    params = [p.name for p in inspect.signature(f).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    by_hint: dict[Any, Any] = {}
    params_of: dict[Any, list[str]] = {}

    def remember(name: str, spec: Any) -> None:
        k = _key(strip(hints[name])) if name in hints else None
        if k is None:
            return
        params_of.setdefault(k, []).append(name)
        if k in by_hint and by_hint[k] is not _AMBIGUOUS and by_hint[k] != spec:
            by_hint[k] = _AMBIGUOUS
        else:
            by_hint.setdefault(k, spec)

    try:
        if in_specs is None:
            derived = []
            for name, value in zip(params, args, strict=False):
                spec = _tree_specs(hints.get(name, _NO_HINT), value, name, mesh)
                derived.append(spec)
                remember(name, spec)
            in_specs = tuple(derived)
        elif in_specs is not _compat.INFER:  # given specs: reuse their trees for the return
            if isinstance(in_specs, tuple):
                for name, spec in zip(params, in_specs, strict=False):
                    remember(name, spec)
        if out_specs is None:
            if "return" not in hints:
                raise _NotDerivable("the function has no return hint")
            out_specs = _out_specs(hints["return"], by_hint, params_of, "return")
    except _NotDerivable as e:
        raise error("SPMD402", f"{where}: cannot derive the specs from the hints: {e}",
                    op="st.shard_map", fix=_DERIVED_FIX) from None
    return in_specs, out_specs


def names_dimensions(f: Callable[..., Any]) -> bool:
    """Whether a parameter hint of `f` names partitioned dimensions (`st.Float[..., "b/dp d"]`).
    (A `st.Shard` hint alone does not make an omitted in_specs derived: it stays JAX's Infer.)"""
    try:
        hints = typing.get_type_hints(f, include_extras=True)
    except Exception:  # noqa: BLE001
        return False
    return any(hasattr(strip(h), "_axes") for k, h in hints.items() if k != "return")
