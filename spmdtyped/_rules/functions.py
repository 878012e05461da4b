"""Rules of composite forms: traced indexing (`x[i]`, `jnp.take`), constructors (with the fill
join of `full`/`full_like`) and `.at[i].<method>(v)` updates. Each is a small function of the
elementwise rules and the lattice; the runtime (`_array`, `numpy`) and the mypy plugin call
these instead of re-deriving them.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._errors import error
from .combine import binary, combine, unary
from .elementwise import LITERAL, Combined, Operand
from .features import CONSERVATIVE, Features
from .states import INVARIANT, SpmdType, fmt_axes


def auto_cast(t: SpmdType, varying: frozenset[str], *, op: str, what: str = "the value") -> SpmdType:
    """JAX's auto-cast of an operand of type `t` to the `varying` axes of the other operands
    (`core.auto_insert_reshard`): Reduced -> Varying when it is Reduced on exactly the missing
    axes, else pvary, which JAX refuses for a value Reduced on any of them (SPMD205)."""
    rest = varying - t.varying
    if not rest:
        return t
    if t.reduced == rest:
        return t.replace(reduced=frozenset(), varying=t.varying | rest)
    bad_u = t.unreduced & rest
    if bad_u:
        raise error("SPMD201", f"{op}: {what} is Unreduced on {sorted(bad_u)} where another operand "
                    f"is Varying: no cast takes a pending sum to per-device values",
                    axes=sorted(bad_u), states=t.states(sorted(bad_u)), op=op,
                    fix=f"reduce it first: st.psum(x, {fmt_axes(sorted(bad_u))})")
    bad = t.reduced & rest
    if bad:
        raise error("SPMD205", f"{op}: {what} is Reduced on {sorted(t.reduced)} but another "
                    f"operand is Varying on {sorted(rest)}: JAX casts Reduced to Varying only on "
                    f"exactly the Reduced axes", axes=sorted(bad), states=t.states(sorted(bad)),
                    op=op, fix=f"st.pcast(x, {fmt_axes(sorted(t.reduced))}, to='varying')")
    return t.replace(varying=t.varying | rest)


def dynamic_index_type(t: SpmdType, index_types: Sequence[SpmdType],
                       features: Features = CONSERVATIVE, *, op: str = "indexing",
                       gather: bool = False) -> SpmdType:
    """`x[i]` with traced indices: scalar indices are a dynamic_slice (the value's unary rule:
    Unreduced rejected, Reduced kept), an index array is a gather (the `take` row: jax 0.10
    drops Reduced, 0.12 keeps it; Unreduced rejected); then JAX's auto-cast of the value to
    the indices' varying axes (`auto_cast`). Each index is first compared with an Invariant
    zero, as JAX does to wrap negative indices (`lt`: an Unreduced or Reduced index is
    rejected there, as by JAX); the value itself may be Reduced: `x[axis_index('j')]` on
    `Reduced['i']` is `Typed[Varying['j'], Reduced['i']]`."""
    for i in index_types:  # JAX wraps negative indices first: `i < 0` with an Invariant zero
        combine("lt", [i, INVARIANT], features, op=op)
    out = unary("take" if gather else "dynamic_slice", t, features, op=op)  # Unreduced: SPMD202
    varying = frozenset().union(*(i.varying for i in index_types))
    out = auto_cast(out, varying, op=op)
    if out.varying and not gather and features.slice_index_invariant and out.reduced:
        # jax 0.12.1: the start index (auto-cast to the value's varying axes, a literal one
        # too) varies, and the value is still Reduced after the auto-cast
        axes = sorted(out.reduced)
        raise error("SPMD205", f"{op}: a start index that varies over {sorted(out.varying)} cannot "
                    f"slice a value Reduced on {axes} ({features.name})", axes=axes,
                    states=t.states(axes), op=op,
                    fix=f"slice st.pcast(x, {fmt_axes(axes)}, to='varying')")
    return out


#: constructors whose value does not depend on their argument's data: Varying is kept (JAX
#: pvarys the constant); Unreduced and Reduced are dropped (a fresh constant is Invariant),
#: except on jax 0.12.1, which keeps them (`Feature.LIKE_KEEPS_STATE`).
LIKE_CONSTRUCTORS = ("zeros_like", "ones_like", "full_like", "empty_like")
#: constructors from shapes: always Invariant
CONSTRUCTORS = ("zeros", "ones", "full", "empty", "arange", "linspace", "eye")


def constructor_type(name: str, like: SpmdType | None = None,
                     features: Features = CONSERVATIVE) -> SpmdType:
    """The state of `jnp.<name>(...)`: `zeros_like(x)` is Varying where x is (and, on jax
    0.12.1, Unreduced and Reduced where x is: a pending sum kept on one device), else
    Invariant."""
    if name in LIKE_CONSTRUCTORS and like is not None:
        if features.like_keeps_state:
            return SpmdType(like.varying, like.unreduced, like.reduced,
                            "sum" if like.unreduced else None)
        return SpmdType(varying=like.varying)
    if name in LIKE_CONSTRUCTORS or name in CONSTRUCTORS:
        return INVARIANT
    raise KeyError(name)


#: constructors whose other arguments flow into every element: name -> the (position in the
#: call, keyword) of each such argument (`full(shape, fill_value)`, `full_like(a, fill_value)`,
#: `linspace(start, stop, ...)`: traced bounds); `fill_type` joins each one's state
FILL_ARGUMENTS: dict[str, tuple[tuple[int, str], ...]] = {
    "full": ((1, "fill_value"),), "full_like": ((1, "fill_value"),),
    "linspace": ((0, "start"), (1, "stop")),
}


def fill_type(t: SpmdType, fill: Operand | None, features: Features = CONSERVATIVE, *,
              op: str = "st.numpy.full") -> SpmdType:
    """`full(shape, fill)` / `full_like(a, fill)`: the constructor's state `t` joined with a
    traced fill value's state (the fill flows into every element); a Python scalar or no fill
    changes nothing."""
    if fill is None or fill is LITERAL:
        return t
    assert isinstance(fill, SpmdType)
    return combine("add", [t, fill], features, op=op).type


def take_type(t: SpmdType, index: Operand, features: Features = CONSERVATIVE, *,
              op: str = "st.numpy.take") -> SpmdType:
    """`jnp.take(a, indices)`: with a constant index (a literal or an Invariant array) the unary
    `take` rule of `a`; with a traced, varying index the n-ary `take` rule of (a, indices)."""
    if index is LITERAL or (isinstance(index, SpmdType) and not index.axes):
        return unary("take", t, features, op=op)
    return combine("take", [t, index], features, op=op).type


#: `.at[i].<method>(v)` -> its scatter rule (an `ELEMENTWISE` key)
AT_METHODS: dict[str, str] = {"set": "at_set", "add": "at_add", "multiply": "at_mul",
                              "min": "at_min", "max": "at_max"}


def at_update_type(method: str, t: SpmdType, value: Operand, features: Features = CONSERVATIVE,
                   *, op: str | None = None, index: Sequence[SpmdType] = ()) -> SpmdType:
    """`x.at[i].<method>(v)`: JAX first auto-casts `x` and a traced `v` to their common varying
    axes (`auto_cast`), then applies the scatter rule to each and joins them as data flows into
    the result (`combine("add", ...)`: the updated elements carry v's state, the others x's).
    A Python scalar `v` adds nothing. Traced indices `i` that vary make the result vary where
    they do (which elements are updated differs per device); an Unreduced index is rejected."""
    rule = AT_METHODS[method]
    op = op or f".at[].{method}()"
    idx_varying: frozenset[str] = frozenset()
    for i in index:
        if i.unreduced:
            raise error("SPMD202", f"{op}: the index is Unreduced on {sorted(i.unreduced)}",
                        axes=sorted(i.unreduced), states=i.states(sorted(i.unreduced)), op=op,
                        fix=f"reduce the index first: st.psum(i, {fmt_axes(sorted(i.unreduced))})")
        idx_varying |= i.varying
    if value is LITERAL:
        return auto_cast(unary(rule, t, features, op=op), idx_varying, op=op, what="the array")
    assert isinstance(value, SpmdType)
    varying = t.varying | value.varying | idx_varying
    t = auto_cast(t, varying, op=op, what="the array")
    value = auto_cast(value, varying, op=op, what="the update")
    return combine("add", [unary(rule, t, features, op=op), unary(rule, value, features, op=op)],
                   features, op=op).type


#: how `mean_bind` lowers a mean: JAX's `jnp.mean`, or the sum over the local dimensions
#: followed by a division by the element count (a Python scalar: `binary`'s scalar rule)
MEAN, SUM_THEN_DIVIDE = "mean", "sum_then_divide"


def mean_bind(t: SpmdType) -> str:
    """How `jnp.mean(x)` / `x.mean()` of a value in state `t` is bound: `MEAN` for
    Invariant/Varying values, `SUM_THEN_DIVIDE` for an Unreduced or Reduced one (JAX rejects
    jnp.mean there; the sum and the scalar division are exact)."""
    return SUM_THEN_DIVIDE if t.unreduced or t.reduced else MEAN


def mean_type(t: SpmdType, features: Features = CONSERVATIVE, *, op: str = "mean") -> SpmdType:
    """`jnp.mean(x)` / `x.mean()`, bound as `mean_bind` says: unary `mean`, or unary `sum`
    then `binary` `div` by a Python scalar."""
    if mean_bind(t) == MEAN:
        return unary("mean", t, features, op=op)
    return binary("div", unary("sum", t, features, op=op), LITERAL, features, op=op).type


def where_type(cond: Operand, x: Operand, y: Operand, features: Features = CONSERVATIVE, *,
               op: str = "st.numpy.where") -> Combined:
    """`jnp.where(cond, x, y)`: the `where` rule of (cond, x, y), after JAX 0.12's pairwise
    auto-cast of `x` and `y` (`Features.where_pairwise_cast`; SPMD205 where it fails)."""
    if features.where_pairwise_cast and isinstance(x, SpmdType) and isinstance(y, SpmdType):
        varying = x.varying | y.varying
        x = auto_cast(x, varying, op=op, what="x")
        y = auto_cast(y, varying, op=op, what="y")
    return combine("where", [cond, x, y], features, op=op)
