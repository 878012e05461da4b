"""`typed_shard_map`: run an existing raw per-shard function with spmdtyped's checks.

Design (one trace for programs JAX accepts; two mechanisms):

1. **The jaxpr walk**: the program is `jax.shard_map(f)` itself. Its shard_map equation (the
   one JAX staged into the caller's trace, or, called eagerly, the one `jax.make_jaxpr`
   builds once per input signature before the program runs) is walked with `_walk` (the
   engine of `infer`): every collective, elementwise op and the outputs against `out_specs`
   are checked with the strict rules, which finds what JAX accepts and computes wrongly (a
   double psum behind JAX's auto-pvary, cumsum of an Unreduced value, a collective reached
   through `from jax.lax import psum`). The first violation in program order is raised.
2. **Programs JAX rejects**: JAX's error is translated (`_jax_errors`), and the program is
   traced again with `jax.lax`'s collectives routed through `spmdtyped.lax` (`checked_lax()`)
   and the outputs checked against `out_specs` (`run_infer`), so the error names
   spmdtyped's code at the user's line instead of JAX's exception (chained).

Inputs are checked against `in_specs` (structure SPMD402, unknown axes SPMD501, JAX's
sharding mismatch as SPMD403). The executed program is `jax.shard_map(f)`'s.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

from .. import _compat, _validate
from .._boundary.shard_map import check_in_structure, check_mesh_specs, in_spec_errors
from .._errors import SpmdTypeError, error_context
from .._errors.jax_messages import jax_errors
from ._conventions import checked_lax as checked_lax
from ._conventions import checking as checking
from ._conventions import (
    fn_name,
    is_tracer,
    manual_axes,
    named_like,
    raw_outputs,
    resolve_in_specs,
    resolve_mesh,
    signature_key,
)
from ._infer import run_infer, walk_traced


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

    Inside a trace (`jax.jit`, `jax.grad`, ...) the body is traced once: the shard_map
    equation JAX staged is walked with the strict rules, and it is the program JAX lowers.
    Called eagerly, the first call per input signature traces and walks the program before
    it runs.

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
    axis_names = set(_validate.shard_map_args(f, mesh, in_specs, out_specs, axis_names,
                                              "typed_shard_map", infer=_compat.INFER))
    _validate.given_specs(out_specs, "typed_shard_map")
    if f is None:
        return functools.partial(typed_shard_map, mesh=mesh, in_specs=in_specs,
                                 out_specs=out_specs, axis_names=axis_names, check_vma=check_vma)
    name = fn_name(f)
    where = f"typed_shard_map({name})"
    if mesh is not None:
        check_mesh_specs(mesh, in_specs, out_specs, axis_names, where)

    # the program is `jax.shard_map(f)` itself: the jaxpr walk finds what JAX accepts and the
    # strict rules reject; a program JAX rejects is traced again with `jax.lax` routed through
    # `spmdtyped.lax` and its outputs checked (`run_infer`), for spmdtyped's code at the line
    smapped = _compat.shard_map(raw_outputs(f), mesh=mesh, in_specs=in_specs,
                                out_specs=out_specs, axis_names=axis_names, check_vma=check_vma)
    plain = smapped
    #: signature -> (the checked ClosedJaxpr, its output shapes, the checked function)
    traced: dict[Any, tuple[Any, Any, Callable[..., Any]]] = {}

    def first_violation(m: Any, specs: Any, args: tuple[Any, ...],
                        fallback: SpmdTypeError | None) -> SpmdTypeError | None:
        rep = run_infer(f, args, mesh=m, in_specs=specs, out_specs=out_specs,
                        axis_names=axis_names, where=where)
        return rep.violations[0] if rep.violations else fallback

    def trace(m: Any, specs: Any, args: tuple[Any, ...], run: Callable[..., Any]) -> Any:
        with in_spec_errors(where, "typed_shard_map"):
            try:
                with jax_errors(where):
                    return run(*args)
            except SpmdTypeError as e:
                # a rejected program: report its first violation in program order (the jaxpr
                # walk, when JAX accepts the unrouted program), else the routed one
                raise first_violation(m, specs, args, e) or e from e.__cause__
            except Exception as jax_error:
                # JAX's error without a manual-axis message (e.g. the bare AssertionError of
                # an unknown axis on jax 0.10): the routed trace names it, or JAX's stands
                found = first_violation(m, specs, args, None)
                if found is None:
                    raise
                raise found from jax_error

    def check(closed_or_eqn: Any, out: Any, m: Any, args: tuple[Any, ...]) -> None:
        rep = walk_traced(closed_or_eqn, out, f, args, mesh=m, axis_names=axis_names,
                          where=where, steps=False)
        if rep.violations:
            raise rep.violations[0]

    @functools.wraps(f)
    def wrapped(*args: Any) -> Any:
        m = resolve_mesh(mesh, where)
        if mesh is None:
            check_mesh_specs(m, in_specs, out_specs, axis_names, where)
        if not check_vma:  # JAX's program unchecked; its boundary errors with codes
            check_in_structure(resolve_in_specs(in_specs, args), args, where, "typed_shard_map")
            with in_spec_errors(where, "typed_shard_map"), jax_errors(where):
                return plain(*args)
        with error_context(function=name, mesh=m, manual=manual_axes(m, axis_names)):
            return checked_call(m, args)

    def checked_call(m: Any, args: tuple[Any, ...]) -> Any:
        specs = resolve_in_specs(in_specs, args)
        check_in_structure(specs, args, where, "typed_shard_map")
        if any(is_tracer(x) for x in jax.tree_util.tree_leaves(args)):
            # inside the caller's trace (jax.jit, grad, ...): bind once, then check the
            # shard_map equation JAX staged (the program that will be lowered)
            out = trace(m, specs, args, smapped)
            eqn = _compat.staged_shard_map_eqn(out)
            if eqn is not None:
                check(eqn, out, m, args)
                return out
            closed = trace(m, specs, args, jax.make_jaxpr(smapped))  # another kind of trace
            check(closed, out, m, args)
            return out
        key = (signature_key(args), id(m), str(m))
        if key not in traced:
            closed, out_shape = trace(m, specs, args, jax.make_jaxpr(smapped, return_shape=True))
            check(closed, out_shape, m, args)
            traced[key] = (closed, out_shape, smapped)
        return smapped(*args)

    named_like(wrapped, f)
    wrapped.__wrapped_shard_map__ = plain  # type: ignore[attr-defined]
    return wrapped
