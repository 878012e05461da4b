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
from typing import Any

from mypy.nodes import (
    ARG_OPT,
    ARG_POS,
    ARG_STAR,
)
from mypy.plugin import FunctionContext, MethodContext
from mypy.types import (
    CallableType,
    Instance,
    NoneType,
    ProperType,
    Type,
    get_proper_type,
)

from .boundary import OUT_SPEC_MISMATCH, SHARD_MAP_DECORATOR, str_set
from .convert import ARRAY, ARRAY_LIKE, any_type, arg, axes_type, jax_type, map_typed, named

_Ctx = FunctionContext | MethodContext


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


def outside(api: Any, ft: CallableType) -> CallableType:
    """`ft` as callers of its `st.shard_map` see it (see the module docstring)."""
    array = jax_type(api, ARRAY) or any_type()
    array_like = jax_type(api, ARRAY_LIKE) or array
    kept = [i for i, k in enumerate(ft.arg_kinds) if k in (ARG_POS, ARG_OPT, ARG_STAR)]
    return ft.copy_modified(arg_types=[map_typed(ft.arg_types[i], lambda _: array_like, covariant=True)
                                       for i in kept],
                            arg_kinds=[ft.arg_kinds[i] for i in kept],
                            arg_names=[None] * len(kept),   # positional-only
                            ret_type=map_typed(ft.ret_type, lambda _: array, covariant=True, anywhere=True))
