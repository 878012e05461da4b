"""`st.numpy`: the typed `jax.numpy` surface.

Every function takes typed values, raw JAX values and Python scalars, binds the `jax.numpy`
function of the same name on the raw values (the compiled program is the hand-written one),
and returns a typed value whose state comes from the rule table: `_rules.ELEMENTWISE[rule]`
(linear or not, what happens to Unreduced and Reduced operands) through `_array.unary_op`,
`_array.binary` and `_array.nary`, or `_rules.constructor_type` for constructors. In check
mode each result's state is compared with JAX's own (SPMD901).

Each function is built from its row of the surface table (`_surface.NUMPY`: rule, binding,
JAX function), which the mypy plugin and the docs read too; `RULES` is name -> rule.

!!! Example
    ```python
    import spmdtyped as st
    h = st.numpy.tanh(x @ w)                  # Varying["dp", "tp"]
    y = st.numpy.where(h > 0, h, 0.0)         # Varying["dp", "tp"]
    ```
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _compat, _rules, _surface, _validate
from ._rules import LITERAL, SpmdType
from ._typed import refining as _refining
from ._typed.array import (
    array_operand,
    binary,
    call_function,
    checked,
    is_typed,
    nary,
    operand,
    typeof,
    unwrap,
)
from ._typed.array import mean as array_mean

#: st.numpy function -> its rule (an `_rules.ELEMENTWISE` key, or a `_rules` constructor), from
#: the surface table's `st.numpy` rows (`_surface.NUMPY`), the one table
RULES: dict[str, str] = {r.name: r.rule for r in _surface.NUMPY if r.rule is not None}
_REGISTERED: set[str] = set()

_HOW = {"additive": "linear: Unreduced only with Unreduced on the same axes",
        "mul": "bilinear: Unreduced x Reduced on the same axes -> Unreduced",
        "div": "linear in the numerator: Unreduced / Reduced -> Unreduced",
        "dot": "contraction: rejects Unreduced, drops Reduced (as JAX)",
        "select": "selection: rejects Unreduced (JAX keeps only the false branch's state)",
        "nonlinear": "non-linear: rejects Unreduced",
        "linear": "linear: Unreduced and Reduced pass through"}


def _doc(name: str, rule: str, kind: str) -> str:
    if rule in _rules.ELEMENTWISE:
        how = _HOW[_rules.ELEMENTWISE[rule].linearity.value]
    else:
        how = "constructor: Invariant, or Varying where the template argument varies"
    return (f"Typed `jax.numpy.{name}` ({kind}; rule `{rule}`, {how}).\n\n"
            f"**Arguments:** as `jax.numpy.{name}`; array arguments may be typed values, raw JAX "
            f"values or Python scalars.\n\n"
            f"**Returns:** a typed value in the state the rule table gives (`st.typeof`).\n\n"
            f"**Raises:** `CombineError` (SPMD2xx) for operand states the rule rejects.\n\n"
            f"!!! Example\n    ```python\n    y = st.numpy.{name}(...)\n    ```\n")


def _register(name: str, body: Callable[..., Any], kind: str) -> None:
    op = f"st.numpy.{name}"

    def fn(*args: Any, **kwargs: Any) -> Any:
        # arguments jax.numpy rejects (an axis out of range, a float shape) as SPMD509
        with _validate.jax_arguments(op):
            return body(*args, **kwargs)

    fn.__name__ = fn.__qualname__ = name
    fn.__wrapped__ = body  # type: ignore[attr-defined]
    fn.__module__ = __name__
    fn.__doc__ = _doc(name, RULES[name], kind)
    _REGISTERED.add(name)
    globals()[name] = fn


def _rule(row: _surface.Row) -> str:
    assert row.rule is not None, row  # every st.numpy row names a rule
    return row.rule


def _jfn(row: _surface.Row) -> Callable[..., Any]:
    """The JAX function a row binds (`jax.numpy.exp`; `jax.lax.rsqrt`, which jnp lacks)."""
    module = jax.lax if row.jax.startswith("jax.lax.") else jnp
    return getattr(module, row.jax.rpartition(".")[2])  # type: ignore[no-any-return]


# ----------------------------------------------------------------------- one maker per binding


def _dtype_rule(row: _surface.Row, operands: Sequence[Any], op: str) -> str:
    """The rule `row` applies to these operands: its own, or for a row whose rule depends on
    dtypes (`Row.dtypes`) the one `_rules.dtype_rule` picks for the operands' dtypes."""
    rule = _rule(row)
    if row.dtypes is None:
        return rule
    typed = [operand(a) for a in operands]
    return _rules.dtype_rule(row.dtypes, rule, [
        (t, _rules.UNKNOWN if t is LITERAL else np.dtype(jnp.result_type(raw)).name)
        for raw, t in typed], _compat.FEATURES, op=op)


def _unary(row: _surface.Row) -> None:
    jfn, op = _jfn(row), f"st.numpy.{row.name}"

    def f(x: Any, *args: Any, **kwargs: Any) -> Any:
        rule = _dtype_rule(row, [x], op)
        if rule in _rules.LIKE_CONSTRUCTORS:  # `imag` of a real array is `zeros_like`
            return checked(op, jfn(unwrap(x), *args, **kwargs),
                           _rules.constructor_type(rule, typeof(x), _compat.FEATURES))
        return call_function(rule, x, jfn, args, kwargs, op=op, refine=row.refine)

    _register(row.name, f, "reduction over local dimensions" if row.refine == "reduction"
              else "unary")


def _binary(row: _surface.Row) -> None:
    jfn, op = _jfn(row), f"st.numpy.{row.name}"

    def f(x1: Any, x2: Any, /) -> Any:
        rule = _dtype_rule(row, [x1, x2], op)
        return binary(rule, x1, x2, op=op, bind=jfn, refine=(row.refine, {}))

    _register(row.name, f, "binary")


def _where(row: _surface.Row) -> None:
    jfn, op = _jfn(row), f"st.numpy.{row.name}"

    def f(condition: Any, x: Any = None, y: Any = None, /) -> Any:
        if x is None or y is None:
            raise TypeError(f"{op}: the one-argument form (nonzero) has a data-dependent shape "
                            f"and is not supported; pass x and y")
        return nary(lambda t: _rules.where_type(t[0], t[1], t[2], _compat.FEATURES, op=op),
                    [condition, x, y], jfn, op=op, name="where",
                    refine=(row.refine, {"y": y if isinstance(y, (int, float)) else None}))

    _register(row.name, f, "selection")


def _join(row: _surface.Row) -> None:  # concatenate, stack
    rule, jfn, op = _rule(row), _jfn(row), f"st.numpy.{row.name}"

    def f(arrays: Sequence[Any], axis: int = 0, **kwargs: Any) -> Any:
        return nary(rule, list(arrays), lambda *rs: jfn(rs, axis=axis, **kwargs), op=op,
                    refine=(row.refine, {"axis": axis}))

    _register(row.name, f, "join")


def _einsum(row: _surface.Row) -> None:
    rule, jfn, op = _rule(row), _jfn(row), f"st.numpy.{row.name}"

    def f(subscripts: str, /, *operands: Any, **kwargs: Any) -> Any:
        return nary(rule, list(operands), lambda *rs: jfn(subscripts, *rs, **kwargs), op=op,
                    refine=(row.refine, {"subscripts": subscripts}))

    _register(row.name, f, "contraction")


def _take(row: _surface.Row) -> None:
    jfn, op = _jfn(row), f"st.numpy.{row.name}"

    def f(a: Any, indices: Any, *args: Any, **kwargs: Any) -> Any:
        raw_a, t = array_operand(a)
        raw_i, t_i = operand(indices)
        out_t = _rules.take_type(t, t_i, _compat.FEATURES, op=op)
        out = jfn(raw_a, raw_i, *args, **kwargs)
        # JAX's own default axis (take: None, flattened; take_along_axis: -1)
        params = _refining.call_params(jfn, raw_a, (raw_i, *args), kwargs)
        return checked(op, out, out_t, _refining.refine(row.refine, row.name, [a, indices], out_t,
                                                        out, op=op, params={"axis": params.get("axis")}))

    _register(row.name, f, "indexing")


def _slice(row: _surface.Row) -> None:  # dynamic_slice_in_dim(operand, start_index, size, axis)
    jfn, op = _jfn(row), f"st.numpy.{row.name}"

    def f(a: Any, start_index: Any, *args: Any, **kwargs: Any) -> Any:
        raw_a, t = array_operand(a)
        raw_i, t_i = operand(start_index)
        # a literal start is the unary rule; a traced one joins its state, as `x[i]` does
        out_t = _rules.dynamic_index_type(t, [] if t_i is LITERAL else [t_i],  # type: ignore[list-item]
                                          _compat.FEATURES, op=op)
        out = jfn(raw_a, raw_i, *args, **kwargs)
        params = _refining.call_params(jfn, raw_a, (raw_i, *args), kwargs)
        return checked(op, out, out_t, _refining.refine(row.refine, row.name, [a], out_t, out,
                                                        op=op, params={"axis": params.get("axis")}))

    _register(row.name, f, "indexing")


def _split(row: _surface.Row) -> None:  # split: a list of pieces, each in the same state
    rule, jfn, op = _rule(row), _jfn(row), f"st.numpy.{row.name}"

    def f(ary: Any, *args: Any, **kwargs: Any) -> Any:
        raw, t = array_operand(ary)
        out_t = _rules.unary(rule, t, _compat.FEATURES, op=op)  # type: ignore[arg-type]
        pieces = jfn(raw, *(unwrap(a) for a in args), **kwargs)
        params = _refining.call_params(jfn, raw, tuple(unwrap(a) for a in args), kwargs)
        return [checked(op, p, out_t, _refining.refine(row.refine, row.name, [ary], out_t, p,
                                                        op=op, params={"axis": params.get("axis")}))
                for p in pieces]

    _register(row.name, f, "structural: a list of pieces")


def _filled(name: str, t: SpmdType, args: tuple[Any, ...], kwargs: dict[str, Any],
            op: str) -> SpmdType:
    """The constructor state `t` joined with the state of each argument that flows into every
    element (`_rules.FILL_ARGUMENTS`: positions in the call, `args`, and keywords)."""
    for position, key in _rules.FILL_ARGUMENTS.get(name, ()):
        value = args[position] if len(args) > position else kwargs.get(key)
        t = _rules.fill_type(t, _fill_operand(value), _compat.FEATURES, op=op)
    return t


def _like(row: _surface.Row) -> None:
    name, jfn, op = row.name, _jfn(row), f"st.numpy.{row.name}"

    def f(a: Any, *args: Any, **kwargs: Any) -> Any:
        t = _filled(name, _rules.constructor_type(name, typeof(a), _compat.FEATURES), (a, *args),
                    kwargs, op)
        raw = jfn(unwrap(a), *(unwrap(x) for x in args), **{k: unwrap(v) for k, v in kwargs.items()})
        return checked(op, raw, t)

    _register(name, f, "constructor")


def _new(row: _surface.Row) -> None:
    name, jfn, op = row.name, _jfn(row), f"st.numpy.{row.name}"

    def f(*args: Any, **kwargs: Any) -> Any:
        t = _filled(name, _rules.constructor_type(name), args, kwargs, op)
        raw = jfn(*(unwrap(x) for x in args), **{k: unwrap(v) for k, v in kwargs.items()})
        return checked(op, raw, t)

    _register(name, f, "constructor")


def _fill_operand(fill: Any) -> Any:
    """None (no fill), LITERAL (a Python scalar) or the fill value's state."""
    if fill is None:
        return None
    t = operand(fill)[1]
    return LITERAL if t is LITERAL else typeof(fill)


def _mean(row: _surface.Row) -> None:
    op = f"st.numpy.{row.name}"

    def f(a: Any, axis: Any = None, *, keepdims: bool = False) -> Any:
        if not is_typed(a):
            a = checked(op, jnp.asarray(a), typeof(a))
        return array_mean(a, axis, keepdims=keepdims, op=op)

    _register(row.name, f, "reduction over local dimensions")


_MAKERS: dict[str, Callable[[_surface.Row], None]] = {
    "unary": _unary, "binary": _binary, "where": _where, "join": _join, "einsum": _einsum,
    "take": _take, "like": _like, "new": _new, "mean": _mean, "slice": _slice, "split": _split}

# one maker per binding, nothing by name: a row's dtype dependence is its `dtypes` field
for _row in _surface.NUMPY:
    _MAKERS[_row.binding](_row)
# every row of the table is defined here, and nothing else
assert _REGISTERED == set(RULES), sorted(_REGISTERED ^ set(RULES))

if TYPE_CHECKING:  # the functions above are made in loops; declare them for type checkers
    abs: Callable[..., Any]
    absolute: Callable[..., Any]
    add: Callable[..., Any]
    amax: Callable[..., Any]
    amin: Callable[..., Any]
    arange: Callable[..., Any]
    arctan2: Callable[..., Any]
    argmax: Callable[..., Any]
    argmin: Callable[..., Any]
    broadcast_to: Callable[..., Any]
    ceil: Callable[..., Any]
    concatenate: Callable[..., Any]
    conj: Callable[..., Any]
    copy: Callable[..., Any]
    cos: Callable[..., Any]
    cumprod: Callable[..., Any]
    cumsum: Callable[..., Any]
    divide: Callable[..., Any]
    dot: Callable[..., Any]
    einsum: Callable[..., Any]
    empty: Callable[..., Any]
    empty_like: Callable[..., Any]
    equal: Callable[..., Any]
    exp: Callable[..., Any]
    expand_dims: Callable[..., Any]
    expm1: Callable[..., Any]
    eye: Callable[..., Any]
    flip: Callable[..., Any]
    floor: Callable[..., Any]
    floor_divide: Callable[..., Any]
    full: Callable[..., Any]
    full_like: Callable[..., Any]
    greater: Callable[..., Any]
    greater_equal: Callable[..., Any]
    dynamic_slice_in_dim: Callable[..., Any]
    imag: Callable[..., Any]
    isfinite: Callable[..., Any]
    isnan: Callable[..., Any]
    less: Callable[..., Any]
    less_equal: Callable[..., Any]
    linspace: Callable[..., Any]
    log: Callable[..., Any]
    log1p: Callable[..., Any]
    logical_and: Callable[..., Any]
    logical_not: Callable[..., Any]
    logical_or: Callable[..., Any]
    logical_xor: Callable[..., Any]
    matmul: Callable[..., Any]
    max: Callable[..., Any]
    maximum: Callable[..., Any]
    mean: Callable[..., Any]
    min: Callable[..., Any]
    minimum: Callable[..., Any]
    mod: Callable[..., Any]
    moveaxis: Callable[..., Any]
    multiply: Callable[..., Any]
    negative: Callable[..., Any]
    not_equal: Callable[..., Any]
    ones: Callable[..., Any]
    ones_like: Callable[..., Any]
    pad: Callable[..., Any]
    power: Callable[..., Any]
    prod: Callable[..., Any]
    ravel: Callable[..., Any]
    real: Callable[..., Any]
    reciprocal: Callable[..., Any]
    remainder: Callable[..., Any]
    repeat: Callable[..., Any]
    reshape: Callable[..., Any]
    roll: Callable[..., Any]
    round: Callable[..., Any]
    rsqrt: Callable[..., Any]
    sign: Callable[..., Any]
    sin: Callable[..., Any]
    sort: Callable[..., Any]
    split: Callable[..., Any]
    sqrt: Callable[..., Any]
    square: Callable[..., Any]
    squeeze: Callable[..., Any]
    stack: Callable[..., Any]
    std: Callable[..., Any]
    subtract: Callable[..., Any]
    sum: Callable[..., Any]
    swapaxes: Callable[..., Any]
    take: Callable[..., Any]
    take_along_axis: Callable[..., Any]
    tanh: Callable[..., Any]
    tile: Callable[..., Any]
    transpose: Callable[..., Any]
    tril: Callable[..., Any]
    triu: Callable[..., Any]
    true_divide: Callable[..., Any]
    var: Callable[..., Any]
    where: Callable[..., Any]
    zeros: Callable[..., Any]
    zeros_like: Callable[..., Any]

# dtypes and constants, so that `import spmdtyped.numpy as snp` covers the usual spellings
float32, float16, bfloat16, int32, bool_ = jnp.float32, jnp.float16, jnp.bfloat16, jnp.int32, jnp.bool_
inf, nan, pi = jnp.inf, jnp.nan, jnp.pi

__all__ = sorted(RULES)  # noqa: PLE0605
