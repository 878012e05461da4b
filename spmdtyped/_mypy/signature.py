"""What callers see of a function under `st.shard_map` (decorator and call form): the function's
own positional parameters (count, order, defaults, `*args`), each typed-state parameter taking
what the boundary takes (`jax.typing.ArrayLike`: a global `jax.Array`, a NumPy array or a
scalar), and its declared return with every typed value a `jax.Array` (outputs leave
`st.shard_map` as plain arrays, in the same pytree). A parameter or output of another type (an
`eqx.Module`, an `nnx.State`, `Any`) keeps it. The parameters are positional-only, as the
boundary passes them (`jax.shard_map` takes no keyword arguments): keyword-only parameters
and `**kwargs` are left out. Extra or missing arguments and keywords are then mypy's own
errors at the call site (`call-arg`), and so is an argument of the wrong type (`arg-type`).

`keeping(hook)` wraps the boundary's hooks (`boundary.analyze`): their own types
(`OutSpecMismatch`, `ShardMapDecorator`), which carry the out_specs checks, are kept; every
other result becomes the signature above. The decorator form without literal out_specs
returns a `ShardMapDecorator` without specs, so that its application is seen too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from mypy.nodes import (
    ARG_OPT,
    ARG_POS,
    ARG_STAR,
    COVARIANT,
    TypeAlias,
    TypeInfo,
)
from mypy.plugin import FunctionContext, MethodContext
from mypy.types import (
    CallableType,
    Instance,
    NoneType,
    ProperType,
    TupleType,
    Type,
    TypeAliasType,
    UnionType,
    get_proper_type,
)

from .boundary import OUT_SPEC_MISMATCH, SHARD_MAP_DECORATOR, str_set
from .convert import any_type, arg, axes_type, is_sarray, named

_Ctx = FunctionContext | MethodContext
#: where JAX's stubs define the array types (jax 0.10.2 and 0.12: `jax.Array` and
#: `jax.typing.ArrayLike` are re-exports of these)
_ARRAY: Final = ("jax._src.basearray", "Array")
_ARRAY_LIKE: Final = ("jax._src.basearray", "ArrayLike")


def keeping(hook: Callable[[Any], Type]) -> Callable[[Any], Type]:
    """`hook` (a boundary hook), with the decorated function's signature kept for callers."""

    def analyze(ctx: _Ctx) -> Type:
        ft: ProperType | None
        res = hook(ctx)
        p = get_proper_type(res)
        if isinstance(p, Instance) and p.type.fullname in (OUT_SPEC_MISMATCH, SHARD_MAP_DECORATOR):
            return res  # the boundary's own checks travel in these
        if isinstance(ctx, FunctionContext):
            fun = arg(ctx, "f")
            if fun is None and ctx.args and ctx.args[0]:
                fun = ctx.args[0][0], ctx.arg_types[0][0]
            if fun is None:  # the decorator form: see its application too
                manual = _manual(ctx)
                if manual is None:
                    return res
                return named(ctx.api, SHARD_MAP_DECORATOR, [NoneType(), axes_type(ctx.api, manual)])
            ft = get_proper_type(fun[1])
        else:
            ft = get_proper_type(ctx.arg_types[0][0]) if ctx.arg_types and ctx.arg_types[0] else None
        if isinstance(ft, CallableType) and not ft.is_type_obj():
            return outside(ctx.api, ft)
        return res

    return analyze


def _manual(ctx: FunctionContext) -> frozenset[str] | None:
    """The literal `axis_names` (empty when not given; None when not literal)."""
    a = arg(ctx, "axis_names")
    return frozenset() if a is None else str_set(a[0])


def _jax_type(api: Any, where: tuple[str, str]) -> Type | None:
    """`jax.Array` / `jax.typing.ArrayLike` from the module table (None: JAX not analysed)."""
    module = getattr(api, "modules", {}).get(where[0])
    sym = module.names.get(where[1]) if module is not None else None
    node = sym.node if sym is not None else None
    if isinstance(node, TypeInfo):
        return Instance(node, [])
    if isinstance(node, TypeAlias):
        return TypeAliasType(node, [])
    return None


def outside(api: Any, ft: CallableType) -> CallableType:
    """`ft` as callers of its `st.shard_map` see it (see the module docstring)."""
    array = _jax_type(api, _ARRAY) or any_type()
    array_like = _jax_type(api, _ARRAY_LIKE) or array
    kept = [i for i, k in enumerate(ft.arg_kinds) if k in (ARG_POS, ARG_OPT, ARG_STAR)]
    return ft.copy_modified(arg_types=[_map(ft.arg_types[i], array_like, covariant=True) for i in kept],
                            arg_kinds=[ft.arg_kinds[i] for i in kept],
                            arg_names=[None] * len(kept),   # positional-only
                            ret_type=_map(ft.ret_type, array, covariant=True, anywhere=True))


def _contains_sarray(t: Type) -> bool:
    p = get_proper_type(t)
    if is_sarray(p):
        return True
    if isinstance(p, TupleType):
        return any(_contains_sarray(i) for i in p.items)
    if isinstance(p, UnionType):
        return any(_contains_sarray(i) for i in p.items)
    if isinstance(p, Instance):
        return any(_contains_sarray(a) for a in p.args)
    return False


def _map(t: Type, array: Type, *, covariant: bool, anywhere: bool = False) -> Type:
    """Every typed value in `t` replaced by `array`. A parameter's type argument that is not
    covariant (`dict[str, Varying["dp"]]`) becomes `Any` where it holds typed values (no
    single array type is right there); an output's (`anywhere`) becomes `array` everywhere,
    as the boundary returns exactly that."""
    if not _contains_sarray(t):
        return t
    p = get_proper_type(t)
    if is_sarray(p):
        return array if covariant or anywhere else any_type()
    if isinstance(p, TupleType):
        return p.copy_modified(items=[_map(i, array, covariant=covariant, anywhere=anywhere)
                                      for i in p.items])
    if isinstance(p, UnionType):
        return UnionType.make_union([_map(i, array, covariant=covariant, anywhere=anywhere)
                                     for i in p.items])
    if isinstance(p, Instance):
        tvars = p.type.defn.type_vars
        args = [_map(a, array, anywhere=anywhere,
                     covariant=covariant and getattr(tv, "variance", None) == COVARIANT)
                for a, tv in zip(p.args, tvars, strict=False)]
        return p.copy_modified(args=args + list(p.args[len(args):]))
    return t
