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

import jax.numpy as jnp

from . import _compat, _rules, _surface
from ._array import binary, checked, is_typed, nary, operand, typeof, unary_op, unwrap
from ._array import mean as array_mean
from ._rules import LITERAL, SpmdType

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


def _register(name: str, fn: Callable[..., Any], kind: str) -> None:
    fn.__name__ = fn.__qualname__ = name
    fn.__module__ = __name__
    fn.__doc__ = _doc(name, RULES[name], kind)
    _REGISTERED.add(name)
    globals()[name] = fn


def _rule(row: _surface.Row) -> str:
    assert row.rule is not None, row  # every st.numpy row names a rule
    return row.rule


def _jfn(row: _surface.Row) -> Callable[..., Any]:
    return getattr(jnp, row.jax.removeprefix("jax.numpy."))  # type: ignore[no-any-return]


# ----------------------------------------------------------------------- one maker per binding


def _unary(row: _surface.Row) -> None:
    rule, jfn, op = _rule(row), _jfn(row), f"st.numpy.{row.name}"

    def f(x: Any, *args: Any, **kwargs: Any) -> Any:
        args = tuple(unwrap(a) for a in args)
        kwargs = {k: unwrap(v) for k, v in kwargs.items()}
        return unary_op(rule, x, lambda r: jfn(r, *args, **kwargs), op=op)

    _register(row.name, f, "unary")


def _binary(row: _surface.Row) -> None:
    rule, jfn, op = _rule(row), _jfn(row), f"st.numpy.{row.name}"

    def f(x1: Any, x2: Any, /) -> Any:
        return binary(rule, x1, x2, op=op, bind=jfn)

    _register(row.name, f, "binary")


def _where(row: _surface.Row) -> None:
    jfn, op = _jfn(row), f"st.numpy.{row.name}"

    def f(condition: Any, x: Any = None, y: Any = None, /) -> Any:
        if x is None or y is None:
            raise TypeError(f"{op}: the one-argument form (nonzero) has a data-dependent shape "
                            f"and is not supported; pass x and y")
        return nary(lambda t: _rules.where_type(t[0], t[1], t[2], _compat.FEATURES, op=op),
                    [condition, x, y], jfn, op=op)

    _register(row.name, f, "selection")


def _join(row: _surface.Row) -> None:  # concatenate, stack
    rule, jfn, op = _rule(row), _jfn(row), f"st.numpy.{row.name}"

    def f(arrays: Sequence[Any], axis: int = 0, **kwargs: Any) -> Any:
        return nary(rule, list(arrays), lambda *rs: jfn(rs, axis=axis, **kwargs), op=op)

    _register(row.name, f, "join")


def _einsum(row: _surface.Row) -> None:
    rule, jfn, op = _rule(row), _jfn(row), f"st.numpy.{row.name}"

    def f(subscripts: str, /, *operands: Any, **kwargs: Any) -> Any:
        return nary(rule, list(operands), lambda *rs: jfn(subscripts, *rs, **kwargs), op=op)

    _register(row.name, f, "contraction")


def _take(row: _surface.Row) -> None:
    jfn, op = _jfn(row), f"st.numpy.{row.name}"

    def f(a: Any, indices: Any, axis: int | None = None, **kwargs: Any) -> Any:
        raw_a, t_a = operand(a)
        raw_i, t_i = operand(indices)
        t = t_a if isinstance(t_a, SpmdType) else _rules.INVARIANT
        out_t = _rules.take_type(t, t_i, _compat.FEATURES, op=op)
        return checked(op, jfn(raw_a, raw_i, axis=axis, **kwargs), out_t)

    _register(row.name, f, "indexing")


def _fill(args: tuple[Any, ...], kwargs: dict[str, Any], position: int) -> Any:
    return args[position] if len(args) > position else kwargs.get("fill_value")


def _like(row: _surface.Row) -> None:
    name, jfn, op = row.name, _jfn(row), f"st.numpy.{row.name}"

    def f(a: Any, *args: Any, **kwargs: Any) -> Any:
        t = _rules.constructor_type(name, typeof(a))
        if name == "full_like":
            t = _rules.fill_type(t, _fill_operand(_fill(args, kwargs, 0)), _compat.FEATURES, op=op)
        raw = jfn(unwrap(a), *(unwrap(x) for x in args), **{k: unwrap(v) for k, v in kwargs.items()})
        return checked(op, raw, t)

    _register(name, f, "constructor")


def _new(row: _surface.Row) -> None:
    name, jfn, op = row.name, _jfn(row), f"st.numpy.{row.name}"

    def f(*args: Any, **kwargs: Any) -> Any:
        t = _rules.constructor_type(name)
        if name == "full":
            t = _rules.fill_type(t, _fill_operand(_fill(args, kwargs, 1)), _compat.FEATURES, op=op)
        raw = jfn(*(unwrap(x) for x in args), **{k: unwrap(v) for k, v in kwargs.items()})
        return checked(op, raw, t)

    _register(name, f, "constructor")


def _fill_operand(fill: Any) -> Any:
    """None (no fill), LITERAL (a Python scalar) or the fill value's state."""
    if fill is None:
        return None
    t = operand(fill)[1]
    return LITERAL if t is LITERAL else typeof(fill)


# ----------------------------------------------------------------------- dtype-dependent rows
# the rule table is dtype-agnostic; these say which rule JAX's implementation applies for the
# operands' dtypes


def _nonbool_compare(x: Any, op: str) -> None:
    """jnp.logical_* turn a non-boolean operand into `x != 0` first (an Invariant zero array)."""
    raw, t = operand(x)
    if isinstance(t, SpmdType) and jnp.result_type(raw) != jnp.bool_:
        _rules.combine("ne", [t, _rules.INVARIANT], _compat.FEATURES, op=op)


def _logical(row: _surface.Row) -> None:
    rule, jfn, op = _rule(row), _jfn(row), f"st.numpy.{row.name}"

    if row.binding == "unary":
        def f(x: Any, /) -> Any:
            _nonbool_compare(x, op)
            return unary_op(rule, x, jfn, op=op)
    else:
        def f(x: Any, y: Any, /) -> Any:  # type: ignore[misc]
            _nonbool_compare(x, op)
            _nonbool_compare(y, op)
            return binary(rule, x, y, op=op, bind=jfn)

    _register(row.name, f, "logical")


def _real_imag(row: _surface.Row) -> None:
    # of a real array: jnp.real is the array itself (no primitive: every state kept), jnp.imag
    # is zeros_like (a constructor: Unreduced/Reduced dropped); of a complex one the primitive
    name, jfn, op = row.name, _jfn(row), f"st.numpy.{row.name}"

    def f(val: Any, /) -> Any:
        raw, t = operand(val)
        if isinstance(t, SpmdType) and not jnp.iscomplexobj(raw):
            if name == "imag":
                return checked(op, jfn(raw), _rules.constructor_type("zeros_like", t))
            return unary_op("copy", val, jfn, op=op)
        return unary_op(name, val, jfn, op=op)

    _register(name, f, "unary")


def _mean(row: _surface.Row) -> None:
    op = f"st.numpy.{row.name}"

    def f(a: Any, axis: Any = None, *, keepdims: bool = False) -> Any:
        if not is_typed(a):
            a = checked(op, jnp.asarray(a), typeof(a))
        return array_mean(a, axis, keepdims=keepdims, op=op)

    _register(row.name, f, "reduction over local dimensions")


def _reduction(row: _surface.Row) -> None:
    rule, jfn, op = _rule(row), _jfn(row), f"st.numpy.{row.name}"

    def f(a: Any, axis: Any = None, *, keepdims: bool = False, **kwargs: Any) -> Any:
        return unary_op(rule, a, lambda r: jfn(r, axis=axis, keepdims=keepdims, **kwargs), op=op)

    _register(row.name, f, "reduction over local dimensions")


_MAKERS: dict[str, Callable[[_surface.Row], None]] = {
    "unary": _unary, "binary": _binary, "where": _where, "join": _join, "einsum": _einsum,
    "take": _take, "like": _like, "new": _new, "mean": _mean}
#: rows whose spelling depends on dtypes or that reduce over local dimensions
_SPECIAL: dict[str, Callable[[_surface.Row], None]] = {
    **dict.fromkeys(("logical_not", "logical_and", "logical_or", "logical_xor"), _logical),
    "real": _real_imag, "imag": _real_imag,
    **dict.fromkeys(("sum", "max", "min", "amax", "amin", "prod", "var", "std"), _reduction),
}

for _row in _surface.NUMPY:
    _SPECIAL.get(_row.name, _MAKERS[_row.binding])(_row)
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
    sign: Callable[..., Any]
    sin: Callable[..., Any]
    sort: Callable[..., Any]
    sqrt: Callable[..., Any]
    square: Callable[..., Any]
    squeeze: Callable[..., Any]
    stack: Callable[..., Any]
    std: Callable[..., Any]
    subtract: Callable[..., Any]
    sum: Callable[..., Any]
    swapaxes: Callable[..., Any]
    take: Callable[..., Any]
    tanh: Callable[..., Any]
    tile: Callable[..., Any]
    transpose: Callable[..., Any]
    true_divide: Callable[..., Any]
    var: Callable[..., Any]
    where: Callable[..., Any]
    zeros: Callable[..., Any]
    zeros_like: Callable[..., Any]

# dtypes and constants, so that `import spmdtyped.numpy as snp` covers the usual spellings
float32, float16, bfloat16, int32, bool_ = jnp.float32, jnp.float16, jnp.bfloat16, jnp.int32, jnp.bool_
inf, nan, pi = jnp.inf, jnp.nan, jnp.pi

__all__ = sorted(RULES)  # noqa: PLE0605
