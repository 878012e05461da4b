"""The runtime side of the Shard / Partial / Rep refinement (DESIGN.md §1b).

Every typed result carries a `refinement` next to its four-state class. The four-state result
is computed first, exactly as without refinements; then `refine` gathers what the form's rule
needs (local shapes, `axis`/`keepdims`, permutations, einsum subscripts, index items,
collective parameters) and calls the rule the form's surface row names (`_surface.Row.refine`,
one of `_surface.REFINE_KINDS`): the rules themselves live in `_rules.refine` and
`_rules.refine_shape`. Nothing here binds a primitive: the lowered program never changes. The
refinement only *adds* errors, for the bug classes of docs/design/shard_partial.md (SPMD108,
SPMD210-213, SPMD215).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from .. import _compat
from .._errors import allowed_codes
from .._rules import INVARIANT, LITERAL, Operand, SpmdType, axis_size
from .._rules import refine as rf
from .._rules.refine import DATA, NONE, Arg, Refinement
from .._rules.refine import shape as rs
from . import memo as _memo
from .hints import is_state_class


def of(x: Any) -> Refinement:
    """The refinement of a typed value; plain for raw JAX values, literals and NumPy arrays."""
    return x.refinement if is_state_class(type(x)) else NONE  # type: ignore[no-any-return]


def _type(x: Any) -> Operand:
    if is_state_class(type(x)):
        return type(x)._spmd_type  # type: ignore[no-any-return]
    if isinstance(x, (bool, int, float, complex)):
        return LITERAL
    if isinstance(x, (np.ndarray, np.generic)):
        return INVARIANT
    t = _compat.typeof_raw_or_none(x)
    return t if t is not None else INVARIANT


def _is_zero(x: Any) -> bool:
    """A Python number equal to zero (`0`, `0.0`; not `False`)."""
    return type(x) in (int, float) and x == 0


def shape_of(x: Any) -> tuple[int, ...] | None:
    raw = x.raw if is_state_class(type(x)) else x
    shape = getattr(raw, "shape", None)
    if type(shape) is tuple and all(type(d) is int for d in shape):  # a tracer's, as it is
        return shape
    if shape is not None:   # numpy ints; a symbolic extent as it is (`rs.dims`)
        return rs.dims(shape)
    if isinstance(raw, (bool, int, float, complex)):
        return ()
    return None


def arg(x: Any) -> Arg:
    """The rule's view of one operand: its four-state type (or LITERAL), refinement, shape."""
    return Arg(_type(x), of(x), shape_of(x))


@functools.cache
def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


_PLAIN_KINDS = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                inspect.Parameter.KEYWORD_ONLY)


@functools.cache
def _plain_parameters(fn: Callable[..., Any]) -> tuple[tuple[str, Any, Any], ...] | None:
    """`fn`'s parameters as (name, kind, default) when it has no `*args` / `**kwargs`."""
    sig = _signature(fn)
    if sig is None or any(p.kind not in _PLAIN_KINDS for p in sig.parameters.values()):
        return None
    return tuple((p.name, p.kind, p.default) for p in sig.parameters.values())


def _bind_plain(params: tuple[tuple[str, Any, Any], ...], positional: Sequence[Any],
                kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """`Signature.bind(...).apply_defaults()` for a signature of plain parameters, without
    building the signature objects (this runs at every typed call of a trace); None where
    the arguments do not bind simply (the caller asks `inspect`, which says why)."""
    out: dict[str, Any] = {}
    n = len(positional)
    for i, (name, kind, default) in enumerate(params):
        if i < n:
            if kind is inspect.Parameter.KEYWORD_ONLY or name in kwargs:
                return None
            out[name] = positional[i]
        elif name in kwargs:
            if kind is inspect.Parameter.POSITIONAL_ONLY:
                return None
            out[name] = kwargs[name]
        elif default is not inspect.Parameter.empty:
            out[name] = default
        else:
            return None
    if n > len(params) or len(out) != len(params) or any(k not in out for k in kwargs):
        return None
    return out


def call_params(fn: Callable[..., Any], first: Any, args: Sequence[Any],
                kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The call's arguments by name, defaults applied (`axis`, `keepdims`, `shift`, ...), as
    the JAX function `fn` would bind them; empty when they do not bind."""
    plain = _plain_parameters(fn)
    if plain is not None:
        got = _bind_plain(plain, (first, *args), kwargs)
        if got is not None:
            return got
    sig = _signature(fn)
    if sig is None:
        return {}
    try:
        bound = sig.bind(first, *args, **kwargs)
    except TypeError:
        return {}
    bound.apply_defaults()
    return dict(bound.arguments)


# ---------------------------------------------------------------------------------- the kinds


def _ndim(x: Arg) -> int | None:
    return len(x.shape) if x.shape is not None else None


def _out_ndim(out_raw: Any) -> int | None:
    shape = getattr(out_raw, "shape", None)
    return len(shape) if shape is not None else None


def _axis(p: Mapping[str, Any], default: Any = None) -> Any:
    axis = p.get("axis", default)
    if isinstance(axis, (list, tuple)):
        return tuple(int(a) for a in axis)
    return None if axis is None else int(axis)


Refiner = Callable[[str, list[Arg], SpmdType, Any, str, Mapping[str, Any]], Refinement]


def _elementwise(name: str, args: list[Arg], out: SpmdType, out_raw: Any, op: str,
                 p: Mapping[str, Any]) -> Refinement:
    return rf.elementwise(name, args, out, op=op, out_ndim=_out_ndim(out_raw))


def _where(name: str, args: list[Arg], out: SpmdType, out_raw: Any, op: str,
           p: Mapping[str, Any]) -> Refinement:
    zero_fill = args[2].type is LITERAL and p.get("y") == 0
    return rf.elementwise("where", args, out, op=op, out_ndim=_out_ndim(out_raw),
                          onehot_fill=zero_fill)


def _reduction(name: str, args: list[Arg], out: SpmdType, out_raw: Any, op: str,
               p: Mapping[str, Any]) -> Refinement:
    x = args[0]
    return rf.reduction(name, x.type, x.ref, out, ndim=_ndim(x), axis=_axis(p),  # type: ignore[arg-type]
                        keepdims=bool(p.get("keepdims", False)), op=op)


def _along(name: str, args: list[Arg], out: SpmdType, out_raw: Any, op: str,
           p: Mapping[str, Any]) -> Refinement:
    x = args[0]
    axis = _axis(p)
    if isinstance(axis, tuple):  # flip/roll over several dims: plain on each of them
        ref = x.ref
        for a in axis:
            ref = rf.along_dim(name, x.type, ref, out, ndim=_ndim(x), axis=a, op=op)  # type: ignore[arg-type]
        return ref
    return rf.along_dim(name, x.type, x.ref, out, ndim=_ndim(x), axis=axis, op=op)  # type: ignore[arg-type]


def _take(name: str, args: list[Arg], out: SpmdType, out_raw: Any, op: str,
          p: Mapping[str, Any]) -> Refinement:
    x, idx = args[0], args[1]
    varying = idx.type.varying if isinstance(idx.type, SpmdType) else frozenset()
    ndim, axis = _ndim(x), _axis(p)
    if ndim and isinstance(axis, int) and isinstance(idx.type, SpmdType):
        rf.indexed_along_shard(x, [rf.neg_dim(axis, ndim)], idx, op)
    return rs.take(x.type, x.ref, out, ndim=ndim or 0, axis=axis,  # type: ignore[arg-type]
                   index_ndim=len(idx.shape or ()), index_varying=varying)


def _einsum(name: str, args: list[Arg], out: SpmdType, out_raw: Any, op: str,
            p: Mapping[str, Any]) -> Refinement:
    spec = p.get("subscripts")
    if not isinstance(spec, str):
        return Refinement(data=any(a.ref.data for a in args))
    return rf.einsum(spec, args, out, op=op)


def _matmul(name: str, args: list[Arg], out: SpmdType, out_raw: Any, op: str,
            p: Mapping[str, Any]) -> Refinement:
    a, b = args
    na, nb = _ndim(a), _ndim(b)
    if na is None or nb is None:
        return Refinement(data=a.ref.data or b.ref.data)
    if na == 0 or nb == 0:  # jnp.dot with a scalar is a product
        return rf.elementwise("mul", args, out, op=op, out_ndim=_out_ndim(out_raw))
    spec = rf.dot_spec(na, nb) if name == "dot" else rf.matmul_spec(na, nb)
    return rf.einsum(spec, args, out, op=op)


def _reshape(name: str, args: list[Arg], out: SpmdType, out_raw: Any, op: str,
             p: Mapping[str, Any]) -> Refinement:
    x, new = args[0], getattr(out_raw, "shape", None)
    if x.shape is None or new is None:
        return Refinement(data=x.ref.data)
    return rs.reshape(out, x.ref, x.shape, tuple(new))


def _perm(name: str, p: Mapping[str, Any], ndim: int) -> list[int] | None:
    name = p.get("name", name)
    if name == "T":
        return None
    if name == "mT":
        return [*range(ndim - 2), ndim - 1, ndim - 2]
    if name == "swapaxes":
        perm = list(range(ndim))
        a, b = int(p["axis1"]) % ndim, int(p["axis2"]) % ndim
        perm[a], perm[b] = perm[b], perm[a]
        return perm
    if name == "moveaxis":
        src = [int(s) % ndim for s in np.atleast_1d(p["source"])]
        dst = [int(d) % ndim for d in np.atleast_1d(p["destination"])]
        order = [n for n in range(ndim) if n not in src]
        for d, s in sorted(zip(dst, src, strict=True)):
            order.insert(d, s)
        return order
    axes = p.get("axes")
    if axes is None or axes == ():
        return None
    return [int(a) % ndim for a in axes]


def _transpose(name: str, args: list[Arg], out: SpmdType, out_raw: Any, op: str,
               p: Mapping[str, Any]) -> Refinement:
    x, ndim = args[0], _ndim(args[0])
    if ndim is None:
        return Refinement(data=x.ref.data)
    return rs.transpose(out, x.ref, _perm(name, p, ndim), ndim)


def _squeeze(name: str, args: list[Arg], out: SpmdType, out_raw: Any, op: str,
             p: Mapping[str, Any]) -> Refinement:
    x = args[0]
    if x.shape is None:
        return Refinement(data=x.ref.data)
    axis = _axis(p)
    dims = ([d for d, n in enumerate(x.shape) if n == 1] if axis is None
            else [axis] if isinstance(axis, int) else list(axis))
    return rs.squeeze(out, x.ref, len(x.shape), dims)


def _expand(name: str, args: list[Arg], out: SpmdType, out_raw: Any, op: str,
            p: Mapping[str, Any]) -> Refinement:
    x, axis = args[0], _axis(p)
    if x.shape is None or axis is None:
        return Refinement(data=x.ref.data)
    return rs.expand(out, x.ref, len(x.shape), [axis] if isinstance(axis, int) else list(axis))


def _broadcast(name: str, args: list[Arg], out: SpmdType, out_raw: Any, op: str,
               p: Mapping[str, Any]) -> Refinement:
    x, new = args[0], getattr(out_raw, "shape", None)
    if x.shape is None or new is None:
        return Refinement(data=x.ref.data)
    return rs.broadcast(out, x.ref, x.shape, tuple(new), uniform=name == "broadcast_to")


def _index(name: str, args: list[Arg], out: SpmdType, out_raw: Any, op: str,
           p: Mapping[str, Any]) -> Refinement:
    x = args[0]
    if x.shape is None or _out_ndim(out_raw) is None:
        return Refinement(data=x.ref.data)
    return rs.index(x.type, x.ref, out, len(x.shape), p["items"], _out_ndim(out_raw),  # type: ignore[arg-type]
                    p.get("index_varying", ()))


def _at(name: str, args: list[Arg], out: SpmdType, out_raw: Any, op: str,
        p: Mapping[str, Any]) -> Refinement:
    if p.get("traced_index"):
        return Refinement(data=any(a.ref.data for a in args))
    return rs.at_update(name, args[0], args[1], out)


def _concat(name: str, args: list[Arg], out: SpmdType, out_raw: Any, op: str,
            p: Mapping[str, Any]) -> Refinement:
    axis, out_ndim = p.get("axis", 0), _out_ndim(out_raw)
    if axis is None or out_ndim is None:
        return Refinement(data=any(a.ref.data for a in args))
    return rs.concatenate(args, out, axis=int(axis), out_ndim=out_ndim, op=op,
                          stack=name == "stack")


def _softmax(name: str, args: list[Arg], out: SpmdType, out_raw: Any, op: str,
             p: Mapping[str, Any]) -> Refinement:
    x = args[0]
    return rf.softmax(name, x.type, x.ref, out, ndim=_ndim(x), axis=_axis(p),  # type: ignore[arg-type]
                      keepdims=bool(p.get("keepdims", False)), op=op)


def _one_hot(name: str, args: list[Arg], out: SpmdType, out_raw: Any, op: str,
             p: Mapping[str, Any]) -> Refinement:
    x = args[0]
    if p.get("axis", -1) != -1:
        return Refinement(data=x.ref.data)
    return rs.one_hot(x.type, x.ref, out, op=op)  # type: ignore[arg-type]


def _constructor(name: str, args: list[Arg], out: SpmdType, out_raw: Any, op: str,
                 p: Mapping[str, Any]) -> Refinement:
    return NONE


def _plain(name: str, args: list[Arg], out: SpmdType, out_raw: Any, op: str,
           p: Mapping[str, Any]) -> Refinement:
    return Refinement(data=any(a.ref.data for a in args))


#: refinement kind (`_surface.REFINE_KINDS`) -> how the runtime computes it
REFINERS: dict[str, Refiner] = {
    "elementwise": _elementwise, "where": _where, "reduction": _reduction, "along": _along,
    "take": _take, "einsum": _einsum, "matmul": _matmul, "reshape": _reshape,
    "transpose": _transpose, "squeeze": _squeeze, "expand": _expand, "broadcast": _broadcast,
    "index": _index, "at": _at, "concat": _concat, "stack": _concat, "softmax": _softmax,
    "one_hot": _one_hot, "constructor": _constructor, "plain": _plain,
}


def refine(kind: str, name: str, operands: Sequence[Any], out: SpmdType, out_raw: Any, *,
           op: str, params: Mapping[str, Any] | None = None) -> Refinement:
    """The refinement of a result: `kind` is the form's `_surface.Row.refine`, `name` its rule
    (or function) name, `operands` the typed/raw/literal operands as given, `out` the
    four-state result already computed, `out_raw` the bound JAX value (for its shape).

    Raises the refinement's errors (SPMD210-213, SPMD215); an allowed one makes that axis
    plain.
    """
    if kind == "constructor":
        return NONE
    refs = [of(x) for x in operands]
    items = grad = data = across = False
    for r in refs:  # (one pass: this runs at every typed op of a trace)
        items, grad = items or bool(r.items), grad or r.grad
        data, across = data or r.data, across or bool(r.across)
    if not items and kind != "where" and not (kind == "broadcast" and refs and refs[0].data):
        # nothing refined among the operands (the common case, kept cheap): the result is
        # plain, only `data` (and `grad`) flow
        ref = DATA if data else NONE
    else:
        ref = _refined(kind, name, operands, refs, out, out_raw, op, params or {})
    if kind in ("elementwise", "broadcast"):
        # `b / st.axis_size(a)`: a replicated term's share of a partial sum over `a`
        share = axis_size.share_of(name, operands) if kind == "elementwise" else None
        if share is not None:
            i, axes = share
            ref = rf.with_share(ref, _type(operands[i]), axes)
        elif rf.zero_result(name, [r.zero or _is_zero(x)
                                   for x, r in zip(operands, refs, strict=True)]):
            ref = dataclasses.replace(ref, zero=True)  # `0.0 * b`: adds nothing to a sum
    if across:  # a value computed only from reductions across the devices of an axis stays one
        ref = rf.with_across(ref, refs)
    return ref.with_grad(True) if grad else ref


_TRACED = object()


def _param_key(v: Any) -> Any:
    """A call parameter in a memo key: a traced or typed value (the array operand a bound
    signature names; no rule reads its data) by a marker, a list by a tuple."""
    if isinstance(v, jax.core.Tracer) or is_state_class(type(v)):
        return _TRACED
    if isinstance(v, list):
        return tuple(_param_key(x) for x in v)
    return v


def _refined(kind: str, name: str, operands: Sequence[Any], refs: list[Refinement],
             out: SpmdType, out_raw: Any, op: str, params: Mapping[str, Any]) -> Refinement:
    """`REFINERS[kind]` on the operands, memoised: a rule reads only the operands' types,
    refinements and shapes, the result's state and shape, its parameters and which codes
    `st.allow` opts out of, so a repeated layer's ops are computed once. A rule that raises is
    not memoised (it raises again at the next call); parameters that cannot be hashed (a
    NumPy array) are not memoised either."""
    types = tuple(_type(x) for x in operands)
    shapes = tuple(shape_of(x) for x in operands)
    key: tuple[Any, ...] | None = (kind, name, op, out, getattr(out_raw, "shape", None),
                                   allowed_codes(), types, tuple(refs), shapes,
                                   tuple((k, _param_key(v)) for k, v in params.items())
                                   if params else ())
    try:
        got = _memo.REFINEMENTS.get(key)  # type: ignore[arg-type]
    except TypeError:
        key, got = None, None
    if got is not None:
        return got
    args = [Arg(t, r, s) for t, r, s in zip(types, refs, shapes, strict=True)]
    ref = REFINERS[kind](name, args, out, out_raw, op, params)
    if key is not None:
        _memo.keep(_memo.REFINEMENTS, key, ref)
    return ref


# ---------------------------------------------------------------------------------- indexing


def _whole(i: slice, extent: Any) -> bool:
    """Whether the slice `i` takes the whole of a dimension of `extent`: any `:` does; on a
    symbolic extent (`jax.export`'s `2*b`, which `slice.indices` refuses) only that."""
    if i.start is None and i.stop is None and i.step is None:
        return True
    return type(extent) is int and i.indices(extent) == (0, extent, 1)


def index_items(idx: Any, shape: Sequence[int]) -> list[str]:
    """The static items of `x[idx]` as `refine_shape.index` reads them."""
    items = idx if isinstance(idx, tuple) else (idx,)
    out: list[str] = []
    dim = 0
    for i in items:
        if i is None:
            out.append("none")
        elif i is Ellipsis:
            out.append("ellipsis")
            dim = len(shape) - sum(1 for j in items if j is not None and j is not Ellipsis)
            continue
        elif isinstance(i, slice):
            full = dim < len(shape) and _whole(i, shape[dim])
            out.append("slice:full" if full else "slice:part")
        elif isinstance(i, (int, np.integer)) and not isinstance(i, bool):
            out.append("int")
        else:
            out.append("array")
        if i is not None:
            dim += 1
    return out
