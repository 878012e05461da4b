"""`st.numpy`: the typed `jax.numpy` surface.

Every function takes typed values, raw JAX values and Python scalars, binds the `jax.numpy`
function of the same name on the raw values (the compiled program is the hand-written one),
and returns a typed value whose state comes from the rule table: `_rules.ELEMENTWISE[rule]`
(linear or not, what happens to Unreduced and Reduced operands) through `_array.unary_op`,
`_array.binary` and `_array.nary`, or `_rules.constructor_type` for constructors. In check
mode each result's state is compared with JAX's own (SPMD901).

Each function's rule and binding come from `_rules.NUMPY_FUNCTIONS` / `_rules.NUMPY_BINDINGS`
(plain data, read by the mypy plugin and the docs too); `RULES` is that table.

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

from . import _compat, _rules
from ._array import binary, checked, is_typed, nary, operand, typeof, unary_op, unwrap
from ._array import mean as _mean
from ._rules import LITERAL, SpmdType

#: st.numpy function -> its rule (an `_rules.ELEMENTWISE` key, or a `_rules` constructor):
#: `_rules.NUMPY_FUNCTIONS`, the one table
RULES: dict[str, str] = _rules.NUMPY_FUNCTIONS
_REGISTERED: set[str] = set()


def _doc(name: str, rule: str, kind: str) -> str:
    if rule in _rules.ELEMENTWISE:
        lin = _rules.ELEMENTWISE[rule].linearity.value
        how = {"additive": "linear: Unreduced only with Unreduced on the same axes",
               "mul": "bilinear: Unreduced x Reduced on the same axes -> Unreduced",
               "div": "linear in the numerator: Unreduced / Reduced -> Unreduced",
               "dot": "contraction: rejects Unreduced, drops Reduced (as JAX)",
               "select": "selection: rejects Unreduced (JAX keeps only the false branch's state)",
               "nonlinear": "non-linear: rejects Unreduced",
               "linear": "linear: Unreduced and Reduced pass through"}[lin]
    else:
        how = "constructor: Invariant, or Varying where the template argument varies"
    return (f"Typed `jax.numpy.{name}` ({kind}; rule `{rule}`, {how}).\n\n"
            f"**Arguments:** as `jax.numpy.{name}`; array arguments may be typed values, raw JAX "
            f"values or Python scalars.\n\n"
            f"**Returns:** a typed value in the state the rule table gives (`st.typeof`).\n\n"
            f"**Raises:** `CombineError` (SPMD2xx) for operand states the rule rejects.\n\n"
            f"!!! Example\n    ```python\n    y = st.numpy.{name}(...)\n    ```\n")


def _register(name: str, fn: Callable[..., Any], kind: str) -> Callable[..., Any]:
    fn.__name__ = fn.__qualname__ = name
    fn.__module__ = __name__
    fn.__doc__ = _doc(name, RULES[name], kind)
    _REGISTERED.add(name)
    globals()[name] = fn
    return fn


def _unary(name: str, jfn: Callable[..., Any] | None = None) -> None:
    rule = RULES[name]
    jfn = jfn or getattr(jnp, name)
    op = f"st.numpy.{name}"

    def f(x: Any, *args: Any, **kwargs: Any) -> Any:
        args = tuple(unwrap(a) for a in args)
        kwargs = {k: unwrap(v) for k, v in kwargs.items()}
        return unary_op(rule, x, lambda r: jfn(r, *args, **kwargs), op=op)

    _register(name, f, "unary")


def _binary(name: str, jfn: Callable[..., Any] | None = None) -> None:
    rule = RULES[name]
    jfn = jfn or getattr(jnp, name)
    op = f"st.numpy.{name}"

    def f(x1: Any, x2: Any, /) -> Any:
        return binary(rule, x1, x2, op=op, bind=jfn)

    _register(name, f, "binary")


# ----------------------------------------------------------------------- elementwise, unary

for _n in ("exp", "log", "tanh", "sqrt", "sin", "cos", "abs", "absolute", "square", "sign",
           "log1p", "expm1", "reciprocal", "floor", "ceil", "round", "isnan", "isfinite",
           "negative", "conj", "copy"):
    _unary(_n)

# ----------------------------------------------------------------------- elementwise, binary

for _n in ("add", "subtract", "multiply", "divide", "true_divide", "power", "maximum",
           "minimum", "less", "less_equal", "greater", "greater_equal", "equal", "not_equal",
           "arctan2", "mod", "remainder", "floor_divide"):
    _binary(_n)


# dtype-dependent spellings: the rule table is dtype-agnostic, so these wrappers say which
# rule JAX's implementation applies for the operands' dtypes

def _nonbool_compare(x: Any, op: str) -> None:
    """jnp.logical_* turn a non-boolean operand into `x != 0` first (an Invariant zero array)."""
    raw, t = operand(x)
    if isinstance(t, SpmdType) and jnp.result_type(raw) != jnp.bool_:
        _rules.combine("ne", [t, _rules.INVARIANT], _compat.FEATURES, op=op)


def _logical(name: str) -> None:
    rule = RULES[name]
    jfn = getattr(jnp, name)
    op = f"st.numpy.{name}"

    if rule == "logical_not":
        def f(x: Any, /) -> Any:
            _nonbool_compare(x, op)
            return unary_op(rule, x, jfn, op=op)
    else:
        def f(x: Any, y: Any, /) -> Any:  # type: ignore[misc]
            _nonbool_compare(x, op)
            _nonbool_compare(y, op)
            return binary(rule, x, y, op=op, bind=jfn)

    _register(name, f, "logical")


for _n in ("logical_not", "logical_and", "logical_or", "logical_xor"):
    _logical(_n)


def _imag(val: Any, /) -> Any:
    # jnp.imag of a real array is zeros_like (a constructor: Unreduced/Reduced dropped); of a
    # complex one the imag primitive
    raw, t = operand(val)
    if isinstance(t, SpmdType) and not jnp.iscomplexobj(raw):
        return checked("st.numpy.imag", jnp.imag(raw), _rules.constructor_type("zeros_like", t))
    return unary_op("imag", val, jnp.imag, op="st.numpy.imag")


def _real(val: Any, /) -> Any:
    # jnp.real of a real array is the array itself (no primitive: every state kept); of a
    # complex one the real primitive
    raw, t = operand(val)
    if isinstance(t, SpmdType) and not jnp.iscomplexobj(raw):
        return unary_op("copy", val, jnp.real, op="st.numpy.real")
    return unary_op("real", val, jnp.real, op="st.numpy.real")


_register("imag", _imag, "unary")
_register("real", _real, "unary")


def _where(condition: Any, x: Any = None, y: Any = None, /) -> Any:
    if x is None or y is None:
        raise TypeError("st.numpy.where: the one-argument form (nonzero) has a data-dependent "
                        "shape and is not supported; pass x and y")
    return nary("where", [condition, x, y], jnp.where, op="st.numpy.where")


_register("where", _where, "selection")

# ----------------------------------------------------------------------- reductions over local dims


def _reduction(name: str, jfn: Callable[..., Any]) -> None:
    rule = RULES[name]
    op = f"st.numpy.{name}"

    def f(a: Any, axis: Any = None, *, keepdims: bool = False, **kwargs: Any) -> Any:
        return unary_op(rule, a, lambda r: jfn(r, axis=axis, keepdims=keepdims, **kwargs), op=op)

    _register(name, f, "reduction over local dimensions")


_REDUCTIONS: list[tuple[str, Callable[..., Any]]] = [
    ("sum", jnp.sum), ("max", jnp.max), ("min", jnp.min), ("amax", jnp.max), ("amin", jnp.min),
    ("prod", jnp.prod), ("var", jnp.var), ("std", jnp.std)]
for _n, _f in _REDUCTIONS:
    _reduction(_n, _f)


def _mean_fn(a: Any, axis: Any = None, *, keepdims: bool = False) -> Any:
    if not is_typed(a):
        a = checked("st.numpy.mean", jnp.asarray(a), typeof(a))
    return _mean(a, axis, keepdims=keepdims, op="st.numpy.mean")


_register("mean", _mean_fn, "reduction over local dimensions")

for _n in ("cumsum", "cumprod", "argmax", "argmin", "flip", "sort"):
    _unary(_n)

# ----------------------------------------------------------------------- shapes

for _n in ("reshape", "transpose", "swapaxes", "moveaxis", "expand_dims", "squeeze", "ravel",
           "broadcast_to", "roll", "tile", "repeat", "pad"):
    _unary(_n)


def _joined(name: str) -> None:
    jfn = getattr(jnp, name)
    op = f"st.numpy.{name}"

    def f(arrays: Sequence[Any], axis: int = 0, **kwargs: Any) -> Any:
        return nary(name, list(arrays), lambda *rs: jfn(rs, axis=axis, **kwargs), op=op)

    _register(name, f, "join")


_joined("concatenate")
_joined("stack")

# ----------------------------------------------------------------------- contractions


def _einsum(subscripts: str, /, *operands: Any, **kwargs: Any) -> Any:
    return nary("einsum", list(operands), lambda *rs: jnp.einsum(subscripts, *rs, **kwargs),
                op="st.numpy.einsum")


_register("einsum", _einsum, "contraction")
_binary("dot")
_binary("matmul")

# ----------------------------------------------------------------------- indexing


def _take(a: Any, indices: Any, axis: int | None = None, **kwargs: Any) -> Any:
    op = "st.numpy.take"
    raw_i, t_i = operand(indices)
    if t_i is LITERAL or (isinstance(t_i, SpmdType) and not t_i.axes):
        return unary_op("take", a, lambda r: jnp.take(r, raw_i, axis=axis, **kwargs), op=op)
    return nary("take", [a, indices],
                lambda r, i: jnp.take(r, i, axis=axis, **kwargs), op=op)


_register("take", _take, "indexing")

# ----------------------------------------------------------------------- constructors


def _fill_type(t: SpmdType, fill_value: Any, op: str) -> SpmdType:
    if fill_value is None or operand(fill_value)[1] is LITERAL:
        return t
    return _rules.combine("add", [t, typeof(fill_value)], _compat.FEATURES, op=op).type


def _like(name: str) -> None:
    jfn = getattr(jnp, name)
    op = f"st.numpy.{name}"

    def f(a: Any, *args: Any, **kwargs: Any) -> Any:
        t = _rules.constructor_type(name, typeof(a))
        if name == "full_like":
            fill = args[0] if args else kwargs.get("fill_value")
            t = _fill_type(t, fill, op)
        raw = jfn(unwrap(a), *(unwrap(x) for x in args), **{k: unwrap(v) for k, v in kwargs.items()})
        return checked(op, raw, t)

    _register(name, f, "constructor")


def _new(name: str) -> None:
    jfn = getattr(jnp, name)
    op = f"st.numpy.{name}"

    def f(*args: Any, **kwargs: Any) -> Any:
        t = _rules.constructor_type(name)
        if name == "full":
            t = _fill_type(t, args[1] if len(args) > 1 else kwargs.get("fill_value"), op)
        raw = jfn(*(unwrap(x) for x in args), **{k: unwrap(v) for k, v in kwargs.items()})
        return checked(op, raw, t)

    _register(name, f, "constructor")


for _n, _b in _rules.NUMPY_BINDINGS.items():
    if _b == "like":
        _like(_n)
    elif _b == "new":
        _new(_n)
# every function of the table is defined here, and nothing else
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
