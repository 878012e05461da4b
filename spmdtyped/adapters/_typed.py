"""`typed_shard_map`: run an existing raw per-shard function with spmdtyped's checks.

Design (checks at three places, two mechanisms):

1. **Collectives** are checked as they are traced: while the body is traced, `jax.lax`'s
   collectives are routed through `spmdtyped.lax` (`checked_lax()`), so a collective JAX would
   reject (psum of a Reduced value, ppermute of an Unreduced one, an unknown axis) raises the
   SpmdTypeError with its code first, at the user's line.
2. **Everything JAX accepts but the strict rules reject** (a double psum hidden behind JAX's
   auto-pvary, cumsum of an Unreduced value, a collective reached through
   `from jax.lax import psum`, which routing cannot see) is found by walking the traced jaxpr
   with `_walk` (that is, `infer`), once per input signature, before the program runs; the
   first violation in program order is raised.
3. **Outputs** are checked against `out_specs` with `_rules.check_out_spec` (SPMD401) before
   JAX's own check, inputs against `in_specs` (structure SPMD402, unknown axes SPMD501, JAX's
   sharding mismatch as SPMD403).

Routing alone would miss (2); walking alone would only ever see programs JAX accepted, and
report JAX's ValueError for the rest. The executed program is `jax.shard_map(f)`'s.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax

from .. import _compat
from .. import lax as _slax
from .._errors import SpmdTypeError, error
from .._jax_errors import jax_errors
from .._shard_map import _check_spec_axes, check_in_structure, check_outputs, in_spec_errors
from . import _walk

_ROUTE_LOCK = threading.RLock()
_ROUTE_DEPTH = [0]
_SAVED: dict[str, Any] = {}


@contextlib.contextmanager
def checked_lax() -> Iterator[None]:
    """Route `jax.lax`'s collectives through `spmdtyped.lax` inside the block.

    Code that calls `jax.lax.psum(...)` or `lax.psum(...)` after `from jax import lax` is
    checked; names imported before (`from jax.lax import psum`) are not (the jaxpr walk of
    `typed_shard_map` still sees them). Process-wide while active: meant for tracing.

    !!! Example
        ```python
        with st.adapters.checked_lax():
            jax.make_jaxpr(jax.shard_map(f, mesh=mesh, in_specs=..., out_specs=...))(x)
        ```
    """
    with _ROUTE_LOCK:
        if _ROUTE_DEPTH[0] == 0:
            for name in _slax.CHECKED:
                _SAVED[name] = getattr(jax.lax, name)
                setattr(jax.lax, name, getattr(_slax, name))
        _ROUTE_DEPTH[0] += 1
    try:
        yield
    finally:
        with _ROUTE_LOCK:
            _ROUTE_DEPTH[0] -= 1
            if _ROUTE_DEPTH[0] == 0:
                for name, fn in _SAVED.items():
                    setattr(jax.lax, name, fn)
                _SAVED.clear()


#: the name the porting guide uses: `with st.adapters.checking(): ...`
checking = checked_lax


def _manual_axes(mesh: Any, axis_names: Any) -> tuple[str, ...]:
    mesh_axes = _compat.mesh_axis_names(mesh)
    names = {axis_names} if isinstance(axis_names, str) else set(axis_names or ())
    return tuple(a for a in mesh_axes if not names or a in names)


def _signature_key(args: Any) -> Any:
    leaves, tree = jax.tree_util.tree_flatten(args)
    return tree, tuple(str(jax.typeof(leaf)) if hasattr(leaf, "shape") else repr(leaf)
                       for leaf in leaves)


def fn_name(f: Any) -> str:
    """The name of a function, a `functools.partial` of one, or a jitted/decorated one."""
    while isinstance(f, functools.partial):
        f = f.func
    return getattr(f, "__name__", None) or repr(f)


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


def resolve_in_specs(in_specs: Any, args: tuple[Any, ...]) -> Any:
    """`in_specs`, or (`jax.sharding.Infer`, JAX's default) the arguments' own specs."""
    return _compat.inferred_specs(args) if in_specs is _compat.INFER else in_specs


def _is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def typed_shard_map(f: Callable[..., Any] | None = None, /, *, out_specs: Any,
                    in_specs: Any = _compat.INFER, mesh: Any = None,
                    axis_names: Any = frozenset(), check_vma: bool = True) -> Any:
    """`jax.shard_map` for an existing raw per-shard function, with spmdtyped's checks.

    `f` is unchanged: it receives and returns raw JAX values. Its collectives, outputs and
    inputs are checked (see the module docs); the executed program is `jax.shard_map`'s.
    Same arguments and defaults as `jax.shard_map`: `mesh` defaults to the mesh of
    `jax.set_mesh(...)`, `in_specs` to `jax.sharding.Infer` (the arguments' shardings); the
    decorator form `@typed_shard_map(out_specs=...)` and `functools.partial` / jitted bodies
    work. With `check_vma=False` it is plain `jax.shard_map`.

    The body is traced once: the jaxpr JAX builds is walked with the strict rules, then its
    equations are bound again (`jax.core.eval_jaxpr`), so the lowered program is the raw one's.

    **Arguments:** as `jax.shard_map`.

    **Returns:** the shard-mapped function (global arrays in, global arrays out).

    **Raises:** on the first call with a given input signature, the first `SpmdTypeError`:
    SPMD1xx/2xx/3xx at the user's line (`err.source`), SPMD401/402/403 at the boundary,
    SPMD501 for unknown axes; JAX's own manual-axis errors translated (`_jax_errors.TABLE`).

    !!! Example
        ```python
        with jax.set_mesh(mesh):
            step = st.adapters.typed_shard_map(raw_step, in_specs=(P(), P("dp")),
                                               out_specs=P())
            loss = step(params, batch)
        ```
    """
    if f is None:
        return functools.partial(typed_shard_map, mesh=mesh, in_specs=in_specs,
                                 out_specs=out_specs, axis_names=axis_names, check_vma=check_vma)
    name = fn_name(f)
    where = f"typed_shard_map({name})"
    if mesh is not None:
        mesh_axes = _compat.mesh_axis_names(mesh)
        if in_specs is not _compat.INFER:
            _check_spec_axes(in_specs, mesh_axes, where, "in_specs")
        _check_spec_axes(out_specs, mesh_axes, where, "out_specs")

    def body(*args: Any) -> Any:
        try:
            with checked_lax(), jax_errors(where):
                out = f(*args)
        except SpmdTypeError as e:
            raise _walk.located(e, _walk.exception_source(e)) from e.__cause__
        if check_vma and _compat.check_vma_enabled():
            try:
                check_outputs(out, out_specs, _compat.current_mesh()[1], where)
            except SpmdTypeError as e:
                raise _walk.located(e, _walk.function_source(f)) from None
        return out

    functools.update_wrapper(body, f)
    smapped = _compat.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                axis_names=axis_names, check_vma=check_vma)
    plain = _compat.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                              axis_names=axis_names, check_vma=check_vma)
    #: signature -> (the checked ClosedJaxpr, its output tree, its replay)
    traced: dict[Any, tuple[Any, Any, Callable[..., Any]]] = {}

    def first_violation(m: Any, specs: Any, args: tuple[Any, ...],
                        fallback: SpmdTypeError | None) -> SpmdTypeError | None:
        from ._infer import run_infer

        rep = run_infer(f, args, mesh=m, in_specs=specs, out_specs=out_specs,
                        axis_names=axis_names, where=where)
        return rep.violations[0] if rep.violations else fallback

    @functools.wraps(f)
    def wrapped(*args: Any) -> Any:
        if not check_vma:
            return plain(*args)
        m = resolve_mesh(mesh, where)
        specs = resolve_in_specs(in_specs, args)
        check_in_structure(specs, args, where, "typed_shard_map")
        leaves = jax.tree_util.tree_leaves(args)
        concrete = not any(_is_tracer(x) for x in leaves)
        key = (_signature_key(args), id(m), str(m))
        if concrete and key in traced:
            return traced[key][2](*args)
        with in_spec_errors(where, "typed_shard_map"):
            try:
                with jax_errors(where):
                    closed, out_shape = jax.make_jaxpr(smapped, return_shape=True)(*args)
            except SpmdTypeError as e:
                # a rejected program: report its first violation in program order (the jaxpr
                # walk, when JAX accepts the unrouted program), else the routed one
                raise first_violation(m, specs, args, e) or e from e.__cause__
        from ._infer import walk_traced

        rep = walk_traced(closed, out_shape, f, args, mesh=m, axis_names=axis_names,
                          where=where)
        if rep.violations:
            raise rep.violations[0]
        out_tree = jax.tree_util.tree_structure(out_shape)

        def replay(*a: Any) -> Any:
            return jax.tree_util.tree_unflatten(
                out_tree, _compat.eval_jaxpr(closed, *jax.tree_util.tree_leaves(a)))

        if concrete:
            # replayed as it was traced: the shard_map equation binds as `jax.shard_map`'s own
            # call does (eagerly, or inside the caller's jit)
            traced[key] = (closed, out_tree, replay)
        return replay(*args)

    wrapped.__wrapped_shard_map__ = plain  # type: ignore[attr-defined]
    return wrapped
