"""JAX's own spellings on typed values: `jnp.exp(x)`, `jax.nn.relu(x)`, `jnp.einsum(...)`,
`jax.lax.rsqrt(x)`, `jax.lax.psum(x, "tp")`.

Each is the surface row JAX's function applies (`_surface.by_jax_name`: the st.numpy / st.nn
rows' `jax` functions and the jax.lax aliases), typed by the same `functions.analyze` /
`collectives.analyze` as `st.numpy.exp` / `st.psum`, but only when an argument is a typed value:
a call on plain arrays keeps JAX's declared result (`jax.Array`), so untyped code is unchanged.

JAX declares its parameters `ArrayLike`, which the static view's `SArray` is not: the signature
hook (`widen`, on every `jax.numpy` / `jax.nn` / `jax.lax` function: `names.jax_widened`) adds
`SArray` to every parameter that accepts a `jax.Array`, so that a typed argument is no
`arg-type` error (a function without a row then gives JAX's `jax.Array`: its state unknown);
nothing else of the signature changes. JAX's own modules are left as they are.
"""

from __future__ import annotations

from typing import Final

from mypy.nodes import RefExpr
from mypy.plugin import FunctionContext, FunctionSigContext, MethodContext, MethodSigContext
from mypy.typeops import make_simplified_union
from mypy.types import FunctionLike, Instance, Type, UnionType, get_proper_type

from .. import _surface
from . import collectives, functions, names
from .constants import JAX_ARRAY
from .convert import SARRAY, STATIC, any_type, named

#: containers whose item type is widened too (`jnp.concatenate(arrays: Sequence[ArrayLike])`)
_CONTAINERS: Final = frozenset({"typing.Sequence", "collections.abc.Sequence", "builtins.list",
                                "builtins.tuple", "typing.Iterable", "collections.abc.Iterable"})
#: the short names of the modules in messages (`jnp.exp`, as users write it)
_LABELS: Final = (("jax.numpy.", "jnp."), ("jax.nn.", "jax.nn."), ("jax.lax.", "jax.lax."))


def label(fullname: str) -> str:
    """`jax._src.numpy.ufuncs.exp` -> `jnp.exp`."""
    public = _surface.jax_public(fullname)
    for prefix, short in _LABELS:
        if public.startswith(prefix):
            return short + public.removeprefix(prefix)
    return public


# ------------------------------------------------------------------------------ signatures


def widen(ctx: FunctionSigContext) -> FunctionLike:
    """JAX's signature with `SArray` accepted wherever a `jax.Array` is."""
    sig = ctx.default_signature
    modules = getattr(ctx.api, "modules", None)
    static = modules.get(STATIC) if modules is not None else None
    if static is None or "SArray" not in static.names:  # spmdtyped is not (yet) in this build
        return sig
    if _installed(getattr(ctx.api, "path", "")):  # JAX's own code calling itself
        return sig
    sarray = named(ctx.api, SARRAY, [any_type()] * 4)
    types = [_widen(t, sarray) for t in sig.arg_types]
    if all(a is b for a, b in zip(types, sig.arg_types, strict=True)):
        return sig
    return sig.copy_modified(arg_types=types)


def _widen(t: Type, sarray: Instance) -> Type:
    p = get_proper_type(t)
    if isinstance(p, UnionType):
        widened = [_widen(i, sarray) for i in p.items]
        if any(a is not b for a, b in zip(widened, p.items, strict=True)):
            return make_simplified_union(widened)
        return t
    if isinstance(p, Instance):
        if p.type.fullname == JAX_ARRAY:
            return make_simplified_union([p, sarray])
        if p.type.fullname in _CONTAINERS and p.args:
            args = [_widen(a, sarray) for a in p.args]
            if any(a is not b for a, b in zip(args, p.args, strict=True)):
                return p.copy_modified(args=args)
    return t


def _installed(path: str) -> bool:
    path = "/" + path.replace("\\", "/")
    return "/site-packages/" in path or "/dist-packages/" in path


# ------------------------------------------------------------------------------ results


def _mentions_typed(t: Type, depth: int = 0) -> bool:
    """Whether a type is (or holds, one container deep) a typed value."""
    p = get_proper_type(t)
    if isinstance(p, Instance):
        if p.type.fullname == SARRAY:
            return True
        return depth == 0 and any(_mentions_typed(a, 1) for a in p.args)
    if isinstance(p, UnionType):
        return any(_mentions_typed(i, depth) for i in p.items)
    items = getattr(p, "items", None)  # a tuple type
    return depth == 0 and isinstance(items, list) and any(_mentions_typed(i, 1) for i in items)


def typed_call(ctx: FunctionContext) -> bool:
    """Whether any argument of the call is a typed value."""
    return any(_mentions_typed(t) for ts in ctx.arg_types for t in ts)


def analyze_function(ctx: FunctionContext, row: _surface.Row, op: str) -> Type:
    """`jnp.<name>(...)` / `jax.nn.<name>(...)` / `jax.lax.<name>(...)`: its row's rule when an
    argument is typed; JAX's declared result otherwise."""
    if not typed_call(ctx):
        return ctx.default_return_type
    assert row.rule is not None
    return functions.analyze(ctx, (row.kind, row.name, row.rule, row.binding), op=op)


def analyze_ufunc(ctx: MethodContext) -> Type:
    """`jnp.add(x, y)`: JAX declares its binary ufuncs as `BinaryUfunc` objects; the row is the
    called name's (`jnp.add` -> `st.numpy.add`)."""
    callee = getattr(ctx.context, "callee", None)
    fullname = callee.fullname if isinstance(callee, RefExpr) else ""
    row = names.jax_row(fullname) if fullname else None
    if row is None:
        return ctx.default_return_type
    return analyze_function(ctx, row, label(fullname))  # type: ignore[arg-type]


def widen_method(ctx: MethodSigContext) -> FunctionLike:
    """`BinaryUfunc.__call__`'s signature with `SArray` accepted (`widen`)."""
    return widen(ctx)  # type: ignore[arg-type]


def analyze_collective(ctx: FunctionContext, name: str) -> Type:
    """`jax.lax.psum(x, "tp")` of a typed `x`: checked and typed as `st.psum(x, "tp")`."""
    if name == "axis_index" or not typed_call(ctx):  # JAX's raw result: kept
        return ctx.default_return_type
    return collectives.analyze(ctx, name, label=f"jax.lax.{name}")
