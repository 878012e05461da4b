"""Typed values: operators and array methods, each typed through `_rules`, bound through JAX.

A typed value is an instance of its state class (`_hints.state_class`), holding the JAX value
in `.raw`. Every state class is a registered pytree (one child: the raw value; the state is
the class itself), so typed values pass through `jax.jit`, `jax.tree_util` and friends.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import operator
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _compat, _rules, _surface, _validate
from .._errors import error
from .._rules import LITERAL, Operand, SpmdType
from .._rules.refine import NONE as NO_REFINEMENT
from .._rules.refine import Refinement
from . import hints as _hints
from . import memo as _memo
from . import protocols as _protocols
from . import refining as _refining
from .hints import STATE_META, SArray, is_state_class, state_class

# ------------------------------------------------------------------- pytree registration


def _register(cls: type) -> None:
    jax.tree_util.register_pytree_node(
        cls,
        lambda x: ((x.raw,), None),
        lambda _aux, children, cls=cls: _unflatten(cls, children[0]),
    )


def _new(cls: type, raw: Any, refinement: Refinement = NO_REFINEMENT) -> Any:
    obj = object.__new__(cls)
    obj.raw = raw
    obj.refinement = refinement
    return obj


def refinement_of(x: Any) -> Refinement:
    """The Shard/Partial/Rep refinement of a typed value (plain for anything else: raw JAX
    values, literals, NumPy arrays)."""
    return x.refinement if is_state_class(type(x)) else NO_REFINEMENT  # type: ignore[no-any-return]


def with_refinement(x: Any, refinement: Refinement) -> Any:
    """The typed value `x` (same JAX value and state) with `refinement`, restricted to the
    axes `x` is Varying on."""
    return _new(type(x), x.raw, refinement.restrict(type(x)._spmd_type.varying))


def _unflatten(cls: type, raw: Any) -> Any:
    if is_state_class(type(raw)):
        # a tree_map whose function returned a typed value (`p - lr * g` with a typed `lr`):
        # that value is the node, typed by the rules, never a typed value inside a typed value
        return raw
    # jax.grad / jax.vjp rebuild the *primal's* class around each cotangent, but a cotangent's
    # state differs (Reduced <-> Unreduced, reference §5): inside a checking shard_map, a JAX
    # value whose state disagrees with the class gets the class of its own state.
    t = _compat.typeof_raw_or_none(raw)
    if t is not None and t != cls._spmd_type and _compat.current_mesh()[1] \
            and _compat.check_vma_enabled():
        cls = state_class(t)
    return _new(cls, raw)


# classes made before this module was imported (Invariant, hints used in annotations), then
# every later one
_hints.on_state_class(_register)

# ------------------------------------------------------------------- check mode

_CHECK = [True]


def set_check_mode(on: bool) -> None:
    """Turn the comparison of every predicted state with JAX's own on (default) or off.

    Check mode costs one `jax.typeof` per op at trace time and nothing in the compiled program.
    """
    _CHECK[0] = bool(on)


@contextlib.contextmanager
def check_mode(on: bool) -> Iterator[None]:
    old = _CHECK[0]
    _CHECK[0] = bool(on)
    try:
        yield
    finally:
        _CHECK[0] = old


def checked(op: str, out: Any, predicted: SpmdType, refinement: Refinement = NO_REFINEMENT) -> Any:
    """Compare JAX's state of `out` with the table's prediction (SPMD901), then wrap it with
    its refinement."""
    cls = state_class(predicted)
    if _CHECK[0] and not _VMA_OFF[0]:
        actual = _compat.typeof_raw(out)
        # `actual` is a state class's own SpmdType (see _compat.mat_to_spmd): identity first
        if actual is not cls._spmd_type and actual != predicted:
            raise error("SPMD901", f"{op}: the rule table predicted {predicted}, JAX computed "
                        f"{actual} ({_compat.FEATURES.name})", op=op,
                        details=(f"jax {jax.__version__}",))
    return _new(cls, out, refinement)


_VMA_OFF = [0]


def in_vma_off() -> bool:
    """Inside an `st.shard_map(..., check_vma=False)` body: JAX types every value Invariant,
    so spmdtyped tracks the states itself and skips the comparison with JAX."""
    return _VMA_OFF[0] > 0


@contextlib.contextmanager
def vma_off() -> Iterator[None]:
    _VMA_OFF[0] += 1
    try:
        yield
    finally:
        _VMA_OFF[0] -= 1


# ------------------------------------------------------------------- state of anything


def wrap(raw: Any, spmd_type: SpmdType | None = None) -> Any:
    """A typed value for a raw JAX value; the state is read from JAX unless given.

    **Arguments:**

    - `raw`: a JAX array or tracer (inside shard_map), or a typed value (returned as is).
    - `spmd_type`: the state to record instead of JAX's (must then agree in check mode).

    **Returns:** an instance of the state class, e.g. `st.Varying["dp"]`.
    """
    if spmd_type is not None and not isinstance(spmd_type, SpmdType):
        raise error("SPMD504", f"st.wrap: the state must be an st.SpmdType, not "
                    f"{type(spmd_type).__name__} {spmd_type!r}", op="st.wrap",
                    fix="st.wrap(raw), or st.wrap(raw, st.SpmdType(varying={'dp'}))")
    if _is_container(raw):  # a pytree (tuple, eqx.Module, nnx state, dataclass): every leaf
        return jax.tree_util.tree_map(lambda r: wrap(r, spmd_type), raw, is_leaf=is_typed)
    if is_state_class(type(raw)):
        if spmd_type is not None and spmd_type != raw.spmd_type:
            raise error("SPMD504", f"st.wrap: value is already typed {raw.spmd_type}, not "
                        f"{spmd_type}", op="st.wrap", fix="st.wrap(x) (keep its state)")
        return raw
    actual = _compat.typeof_raw_or_none(raw)
    if spmd_type is None:
        try:
            spmd_type = actual if actual is not None else _compat.typeof_raw(raw)
        except TypeError:
            raise error("SPMD509", f"st.wrap: raw must be a JAX array (or a pytree of them), "
                        f"got {type(raw).__name__} {raw!r:.60}", op="st.wrap",
                        fix="st.wrap(jnp.asarray(value))") from None
    elif actual is not None and actual != spmd_type and not in_vma_off() \
            and _compat.current_mesh()[1]:
        raise error("SPMD504", f"st.wrap: JAX types this value {actual}, not the {spmd_type} "
                    f"given", op="st.wrap", details=(f"jax: {actual}", f"given: {spmd_type}"),
                    fix="st.wrap(raw) (the state JAX computed), or cast it first (st.pcast/st.pvary)")
    return _new(state_class(spmd_type), raw)


def local(x: Any, axis_name: Any) -> Any:
    """Mark `x` as local on purpose over `axis_name`: its Shard / Partial / Rep refinement on
    those axes is forgotten (plain Varying), so the refinement's checks (SPMD108, SPMD210-213,
    SPMD215) do not apply to what is computed from it. Nothing is bound: the state and the
    program are unchanged.

    **Arguments:** `x`: a typed value or a pytree of them; `axis_name`: an axis or a tuple.

    **Returns:** the same values, plain Varying on the axes.

    !!! Example
        ```python
        gram = st.local(g.T @ g, "tp")      # this shard's block, on purpose (not a partial sum)
        w, u = jnp.linalg.eigh(gram.raw)
        ```
    """
    names = _rules.normalize_axes(axis_name, "st.local")
    mesh_axes, manual = _compat.current_mesh()
    if manual:  # a typo would forget nothing, silently
        _rules.check_axes_known(names, "st.local", manual, mesh_axes)
    axes = frozenset(names)

    def one(v: Any) -> Any:
        if not is_typed(v):
            return v
        ref = v.refinement
        return _new(type(v), v.raw, dataclasses.replace(
            ref, items=tuple((a, k) for a, k in ref.items if a not in axes)))

    return jax.tree_util.tree_map(one, x, is_leaf=is_typed)


def unwrap(x: Any) -> Any:
    """The JAX value of a typed value (`x.raw`); anything else is returned unchanged. Pytrees too."""
    if is_state_class(type(x)):
        return x.raw
    if type(x) in _SCALARS:  # the common arguments (shapes, axes, dtypes' names) at no cost
        return x
    if type(x) is tuple and all(type(e) in _SCALARS for e in x):
        return x
    if _is_container(x):  # any pytree: eqx.Module, flax nnx state, registered dataclasses, ...
        return jax.tree_util.tree_map(unwrap, x, is_leaf=is_typed)
    return x


#: leaves `unwrap` returns as they are without asking the pytree registry
_SCALARS = frozenset({int, float, bool, complex, str, type(None)})


def _is_container(x: Any) -> bool:
    """A pytree node (not a leaf, not a typed value): wrap/unwrap descend into it."""
    if is_state_class(type(x)) or isinstance(x, (jax.Array, np.ndarray, np.generic)):
        return False
    return not jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(x, is_leaf=is_typed)) \
        or isinstance(x, (list, tuple, dict))


def is_typed(x: Any) -> bool:
    # (`is_state_class(type(x))` without the call: pytree maps ask it of every node)
    return isinstance(type(x), STATE_META)


def typeof(x: Any) -> SpmdType:
    """The manual-axis state of a typed value, or of a raw JAX value/tracer inside shard_map.

    Equal to JAX's `jax.typeof(raw).manual_axis_type` for the same value.
    """
    if is_typed(x):
        return type(x)._spmd_type  # type: ignore[no-any-return]
    if isinstance(x, (int, float, complex, bool, np.ndarray, np.generic)):
        return _rules.INVARIANT
    try:
        return _compat.typeof_raw(x)
    except TypeError:
        raise error("SPMD504", f"st.typeof: {type(x).__name__} is not a JAX value") from None


def operand(x: Any) -> tuple[Any, Operand]:
    """(raw value, type or LITERAL) of an operand."""
    if is_typed(x):
        return x.raw, type(x)._spmd_type
    if isinstance(x, (int, float, complex)) and not isinstance(x, bool) or isinstance(x, bool):
        return x, LITERAL
    if isinstance(x, (np.ndarray, np.generic)):
        return x, _rules.INVARIANT
    try:
        return x, _compat.typeof_raw(x)
    except TypeError:  # None, a str, a list: JAX's "not a valid JAX type", with a code
        raise _validate.not_an_array(x) from None


def array_operand(x: Any) -> tuple[Any, SpmdType]:
    """(raw value, state) of the array operand of a one-array op: a Python scalar is read as
    Invariant (the state of the constant JAX makes of it)."""
    raw, t = operand(x)
    return raw, t if isinstance(t, SpmdType) else _rules.INVARIANT


# ------------------------------------------------------------------- operators

def _resolve(dotted: str) -> Callable[..., Any]:
    """`operator.mod` / `builtins.abs` (a surface row's `jax` binding) -> the function."""
    module, _, name = dotted.partition(".")
    return getattr({"operator": operator, "builtins": builtins}[module], name)  # type: ignore[no-any-return]


#: operator rule -> its symbol and Python function, from the surface table
_SYMBOL = {r.rule: r.symbol for r in _surface.OPERATORS}
_BIND: dict[str, Callable[..., Any]] = {r.rule: _resolve(r.jax) for r in _surface.OPERATORS}  # type: ignore[misc]
_UNARY_BIND: dict[str, Callable[..., Any]] = {r.rule: _resolve(r.jax)  # type: ignore[misc]
                                              for r in _surface.UNARY_OPERATORS}
#: operator rule -> its refinement kind (`_surface.Row.refine`)
_REFINE = {r.rule: r.refine for r in (*_surface.OPERATORS, *_surface.UNARY_OPERATORS)}

#: (refinement kind, parameters) of a call: how `_refining.refine` computes the result's
#: refinement (`_surface.Row.refine` and the call's arguments by name)
Refine = tuple[str, dict[str, Any]]


def _cast_literal(c: Any, like: Any, axes: frozenset[str]) -> Any:
    return _compat.pcast(_compat.asarray_like(c, like), tuple(sorted(axes)), to="reduced")


def binary(name: str, a: Any, b: Any, *, op: str | None = None,
           bind: Callable[[Any, Any], Any] | None = None, refine: Refine | None = None) -> Any:
    """`a <name> b` for typed or raw operands (at least one typed)."""
    op = op or f"operator {_SYMBOL.get(name, name)}"
    bind = bind or _BIND[name]
    key = None if refine is not None and refine[1] else \
        _memo.operands_key((name, op, bind, refine[0] if refine else None), (a, b), _VMA_OFF[0])
    got = None if key is None else _memo.BINARY.get(key)
    if got is None:
        ra, ta = operand(a)
        rb, tb = operand(b)
        res = _rules.binary(name, ta, tb, _compat.FEATURES, op=op,
                            int_literal=tb is LITERAL and isinstance(rb, int)
                            and not isinstance(rb, bool),
                            zero_literal=tb is LITERAL and not isinstance(rb, complex) and rb == 0)
        lit_a, lit_b = ta is LITERAL, tb is LITERAL
    else:  # (a memoised key holds typed values and literals only)
        res, ref = got
        lit_a, lit_b = not isinstance(type(a), STATE_META), not isinstance(type(b), STATE_META)
        ra = a if lit_a else a.raw
        rb = b if lit_b else b.raw
    if res.bind == "integer_pow":
        out = ra ** rb
    else:
        if res.bind == "mul_reciprocal":
            rb, bind = 1.0 / rb, operator.mul
        if res.literal_reduced:
            if lit_a:
                ra = _cast_literal(ra, rb, res.literal_reduced)
            if lit_b:
                rb = _cast_literal(rb, ra, res.literal_reduced)
        out = bind(ra, rb)
    if got is None:
        kind, params = refine or (_REFINE.get(name, "elementwise"), {})
        ref = _refining.refine(kind, name, [a, b], res.type, out, op=op, params=params)
        if key is not None:
            _memo.keep(_memo.BINARY, key, (res, ref))
    return checked(op, out, res.type, ref)


def nary(rule: str | Callable[[list[Operand]], _rules.Combined], args: list[Any],
         bind: Callable[..., Any], *, op: str, refine: Refine | None = None,
         name: str | None = None) -> Any:
    """An n-operand op (where, concatenate, einsum, ...) typed by `combine` of rule `rule`, or
    by `rule(types)` when it is a function of the operand types (`_rules.where_type`); its
    refinement by `refine` (kind, parameters) under `name` (default: the rule)."""
    kind, params = refine or ("plain", {})
    name = name or (rule if isinstance(rule, str) else kind)
    key = _memo.nary_key(rule, name, op, kind, params, args, _VMA_OFF[0])
    got = None if key is None else _memo.NARY.get(key)
    if got is None:
        raws, types = zip(*(operand(a) for a in args), strict=True) if args else ((), ())
        res = (_rules.combine(rule, list(types), _compat.FEATURES, op=op)
               if isinstance(rule, str) else rule(list(types)))
        literal = [t is LITERAL for t in types]
    else:  # (a memoised key holds typed values and literals only)
        res, ref, shape = got
        literal = [not is_state_class(type(a)) for a in args]
        raws = tuple(a if lit else a.raw for a, lit in zip(args, literal, strict=True))
    if res.literal_reduced:
        like = next(r for r, lit in zip(raws, literal, strict=True) if not lit)
        raws = tuple(_cast_literal(r, like, res.literal_reduced) if lit else r
                     for r, lit in zip(raws, literal, strict=True))
    out = bind(*raws)
    # `bind` is the caller's closure (einsum's subscripts, concatenate's axis, ...): the
    # refinement is served only for the result shape it was computed for
    if got is None or getattr(out, "shape", None) != shape:
        ref = _refining.refine(kind, name, args, res.type, out, op=op, params=params)
        if key is not None:
            _memo.keep(_memo.NARY, key, (res, ref, getattr(out, "shape", None)))
    return checked(op, out, res.type, ref)


def unary_op(name: str, x: Any, bind: Callable[[Any], Any] | None = None, *, op: str | None = None,
             refine: Refine | None = None) -> Any:
    """A one-operand op of rule `name`; its refinement by `refine` (kind, parameters; default
    elementwise)."""
    raw, t = array_operand(x)
    op = op or name
    if bind is None:
        bind = _UNARY_BIND[name]
    out_t = _rules.unary(name, t, _compat.FEATURES, op=op)
    out = bind(_lowering_cast(name, t, raw))
    kind, params = refine or ("elementwise", {})
    return checked(op, out, out_t,
                   _refining.refine(kind, name, [x], out_t, out, op=op, params=params))


def _lowering_cast(row: str, t: SpmdType, raw: Any) -> Any:
    """Rows JAX types on a Reduced value but cannot lower (`_rules.VARY`): bind them on the
    value cast to Varying on its Reduced axes (a free cast), as the rule's result says."""
    if t.reduced and _rules.ELEMENTWISE[row].on_reduced == _rules.VARY and not in_vma_off():
        return _compat.pcast(raw, tuple(sorted(t.reduced)), to="varying")
    return raw


def _argument_value(name: str, v: Any, op: str = "st.numpy") -> Any:
    """An argument as `_rules.argument_rule` reads it: a dtype by its NumPy name, a Python
    literal as is, an array as itself (a value the rules do not read)."""
    if name == "dtype" and v is not None:
        try:
            return np.dtype(v).name
        except TypeError:
            raise _validate.bad(op, "dtype", v, "a dtype (jnp.float32, 'int32', bool, ...)",
                                "dtype=jnp.float32") from None
    return v


def _dtype_name(raw: Any) -> str:
    """The NumPy name of the dtype JAX gives `raw`: a JAX value's own (already canonical), else
    JAX's for it (a Python scalar's default, a NumPy float64 array's float32 without x64)."""
    if isinstance(raw, (jax.core.Tracer, jax.Array)):
        return raw.dtype.name  # type: ignore[no-any-return]
    return np.dtype(jnp.result_type(raw)).name


def call_op(rule: str, x: Any, jfn: Callable[..., Any], args: tuple[Any, ...],
            kwargs: dict[str, Any], *, op: str,
            refine: tuple[str, dict[str, Any] | None] | None = None,
            memo: tuple[Any, ...] | None = None) -> Any:
    """`jfn(x, *args, **kwargs)` for a one-array op whose rule depends on its other arguments
    (`_rules.call_type`: keywords and dtypes pick the row; secondary arrays join the result);
    its refinement by `refine` (kind, parameters; default elementwise). `memo`: the call's
    `_memo.call_key`, under which its typing is kept (`typed_call`)."""
    raw, t = array_operand(x)
    named = _rules.named_arguments(rule, args, kwargs)
    keywords = {k: _argument_value(k, v, op) for k, v in named.items()}
    raw_args = tuple(unwrap(a) for a in args)
    raw_kwargs = {k: unwrap(v) for k, v in kwargs.items()}
    if refine is not None and refine[1] is None:  # arguments the refinement could not read:
        with _validate.jax_arguments(op):         # JAX's verdict on them first (SPMD509)
            jax.eval_shape(lambda r: jfn(r, *raw_args, **raw_kwargs), raw)
        refine, memo = ("plain", {}), None  # JAX accepts them: the result is plain Varying
    secondary = [(n, typeof(named[n])) for n in _rules.SECONDARY.get(rule, ())
                 if named.get(n) is not None and operand(named[n])[1] is not LITERAL]
    dtype = _dtype_name(raw)
    row = _rules.argument_rule(rule, keywords, dtype) or rule
    out_t = _rules.call_type(rule, t, keywords, dtype, secondary, _compat.FEATURES, op=op)
    if out_t is None:  # an argument the rule reads is in no form it knows (dtype=None)
        raise error("SPMD509", f"{op}: cannot tell from its arguments "
                    f"({', '.join(f'{k}={v!r}' for k, v in named.items())}) whether it is "
                    f"linear", op=op, fix=f"{op}(x, dtype=jnp.float32): name the dtype")
    with _validate.jax_arguments(op):
        out = jfn(_lowering_cast(row, t, raw), *raw_args, **raw_kwargs)
    kind, params = refine or ("elementwise", {})
    ref = _refining.refine(kind, rule, [x], out_t, out, op=op, params=params or {})
    if memo is not None:
        _memo.keep(_memo.CALLS, memo, (out_t, row, ref))
    return checked(op, out, out_t, ref)


#: refinement kinds (`_surface.REFINE_KINDS`) that read none of the call's arguments
_NO_PARAMETERS = frozenset({"elementwise", "reshape", "broadcast", "constructor", "plain"})


def typed_call(rule: str, x: Any, jfn: Callable[..., Any], args: tuple[Any, ...],
               kwargs: dict[str, Any], *, op: str, refine: str,
               params: Callable[[], dict[str, Any] | None]) -> Any:
    """`call_op` with the refinement kind `refine`, whose parameters `params()` computes
    (only where that kind reads them, `_NO_PARAMETERS`), the typing memoised by
    `_memo.call_key`: a repeated layer's call binds `jfn` and compares JAX's state, nothing
    more."""
    key = _memo.call_key(rule, x, jfn, args, kwargs, op, refine, _VMA_OFF[0])
    got = None if key is None else _memo.CALLS.get(key)
    if got is not None:
        out_t, row, ref = got
        with _validate.jax_arguments(op):
            out = jfn(_lowering_cast(row, type(x)._spmd_type, x.raw), *args, **kwargs)
        return checked(op, out, out_t, ref)
    return call_op(rule, x, jfn, args, kwargs, op=op, memo=key,
                   refine=(refine, {} if refine in _NO_PARAMETERS else params()))


def call_function(rule: str, x: Any, jfn: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any], *, op: str, refine: str) -> Any:
    """`call_op` of an `st.numpy` / `st.nn` function row: its refinement kind `refine`, with
    the call's arguments by name where that kind reads them (`axis`, `keepdims`, `shift`)."""
    def params() -> dict[str, Any] | None:
        try:
            return _refining.call_params(jfn, unwrap(x), tuple(unwrap(a) for a in args),
                                         {k: unwrap(v) for k, v in kwargs.items()})
        except (TypeError, ValueError, IndexError):
            return None  # arguments JAX rejects: `call_op` reports them with JAX's message

    return typed_call(rule, x, jfn, args, kwargs, op=op, refine=refine, params=params)


_STATIC_INDEX = str(_surface.STATIC_INDEX.rule)


def is_dynamic_index(idx: Any) -> bool:
    items = idx if isinstance(idx, tuple) else (idx,)
    return any(isinstance(i, (jax.Array, jax.core.Tracer)) or is_typed(i) for i in items)


def getitem(x: SArray, idx: Any) -> Any:
    if is_dynamic_index(idx):
        items = idx if isinstance(idx, tuple) else (idx,)
        idx_types = [typeof(i) for i in items
                     if is_typed(i) or isinstance(i, (jax.Array, jax.core.Tracer))]
        # an integer/boolean index array is a gather (jnp.take's rule); scalars a dynamic_slice
        gather = any(getattr(i, "ndim", 0) > 0 for i in items
                     if is_typed(i) or isinstance(i, (jax.Array, jax.core.Tracer)))
        idx = unwrap(idx)
        raw, t = operand(x)
        out_t = _rules.dynamic_index_type(t, idx_types, _compat.FEATURES, op="indexing",  # type: ignore[arg-type]
                                          gather=gather)
        out = raw[idx]
        varying = frozenset().union(*(i.varying for i in idx_types))
        return checked("indexing", out, out_t, _refining.refine(
            "index", "dynamic_slice", [x], out_t, out, op="indexing",
            params={"items": ["array"], "index_varying": varying}))
    static_items = _refining.index_items(idx, x.raw.shape)
    return unary_op(_STATIC_INDEX, x, lambda r: r[idx], op="indexing",
                    refine=("index", {"items": static_items}))


def mean(x: Any, axis: Any = None, *, keepdims: bool = False, op: str = ".mean()") -> Any:
    """Mean over local dimensions, bound as `_rules.mean_bind` says: jnp.mean (identical
    program), or the sum then a literal-cast division (where JAX rejects jnp.mean)."""
    raw, t = operand(x)
    assert isinstance(t, SpmdType)
    if _rules.mean_bind(t) == _rules.MEAN:
        out, out_t = jnp.mean(raw, axis=axis, keepdims=keepdims), _rules.mean_type(t, _compat.FEATURES, op=op)
        return checked(op, out, out_t, _refining.refine(
            "reduction", "mean", [x], out_t, out, op=op, params={"axis": axis, "keepdims": keepdims}))
    total = unary_op("sum", x, lambda r: jnp.sum(r, axis=axis, keepdims=keepdims), op=op,
                     refine=("reduction", {"axis": axis, "keepdims": keepdims}))
    n = int(np.prod([raw.shape[a] for a in ((axis,) if isinstance(axis, int) else (axis or range(raw.ndim)))]))
    if n == 0:  # the mean of nothing is nan (as jnp.mean); nan * partial sums sums to nan
        return binary("mul", total, float("nan"), op=op)
    return binary("div", total, float(n), op=op)


# __jax_array__, __array__, __iter__, __len__, __bool__/__float__/..., __repr__, IndexError
_protocols.install(SArray, getitem=getitem, vma_off=in_vma_off)
