"""What every porting tool shares: `jax.shard_map`'s calling conventions (a mesh from
`jax.set_mesh`, `in_specs` inferred from the arguments, names of partial/jitted bodies)."""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import jax

from .. import _compat
from .._errors import error


def manual_axes(mesh: Any, axis_names: Any) -> tuple[str, ...]:
    mesh_axes = _compat.mesh_axis_names(mesh)
    names = {axis_names} if isinstance(axis_names, str) else set(axis_names or ())
    return tuple(a for a in mesh_axes if not names or a in names)


def signature_key(args: Any) -> Any:
    leaves, tree = jax.tree_util.tree_flatten(args)
    return tree, tuple(str(jax.typeof(leaf)) if hasattr(leaf, "shape") else repr(leaf)
                       for leaf in leaves)


def fn_name(f: Any) -> str:
    """The name of a function, a `functools.partial` of one, or a jitted/decorated one."""
    while isinstance(f, functools.partial):
        f = f.func
    return getattr(f, "__name__", None) or repr(f)


def named_like(wrapper: Any, f: Any) -> Any:
    """`wrapper` with `f`'s name where `functools.wraps` finds none (a `functools.partial`):
    `jax.jit` names the lowered module after it (`@jit_step`, not `@jit_wrapped`)."""
    if not hasattr(f, "__name__"):
        wrapper.__name__ = wrapper.__qualname__ = fn_name(f)
    return wrapper


def raw_outputs(f: Any) -> Any:
    """`f` whose typed results (spmdtyped's values, from `st.*` calls in a raw body) come back
    as the JAX values they wrap: they never reach the caller's global code."""
    from .._typed.array import is_typed, unwrap

    @functools.wraps(f)
    def body(*args: Any) -> Any:
        return jax.tree_util.tree_map(unwrap, f(*args), is_leaf=is_typed)

    return named_like(body, f)


def resolve_mesh(mesh: Any, where: str, *, concrete: bool = False) -> Any:
    """`mesh`, or (None, as `jax.shard_map` allows) the mesh of `jax.set_mesh`'s context."""
    if mesh is not None:
        return mesh
    m = _compat.context_mesh(concrete=concrete)
    if m is None:
        # TODO(lead): a code of its own (proposed SPMD508 "no-mesh"); SPMD506 meanwhile
        raise error("SPMD506", f"{where}: no mesh: mesh= was not given and no mesh is set",
                    op="shard_map",
                    fix="pass mesh=..., or call inside `with jax.set_mesh(mesh):`")
    return m


def made_current(mesh: Any) -> contextlib.AbstractContextManager[Any]:
    """`mesh` made the context mesh (`jax.set_mesh`) while a call on it is traced by a tool
    (`infer FILE`, `port FILE`, `migrate-vma`): the module may have made another mesh current
    since that call (a notebook's next cell), and JAX refuses a shard_map whose mesh is not
    the context's ("The context mesh ... should match the mesh passed to shard_map"). A no-op
    for None."""
    return jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext()


def resolve_in_specs(in_specs: Any, args: tuple[Any, ...]) -> Any:
    """`in_specs`, or (`jax.sharding.Infer`, JAX's default) the arguments' own specs."""
    return _compat.inferred_specs(args) if in_specs is _compat.INFER else in_specs


def is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)
