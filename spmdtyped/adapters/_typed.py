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

import functools
from collections.abc import Callable
from typing import Any

import jax

from .. import _compat
from .._errors import SpmdTypeError, error_context
from .._shard_map import check_in_structure, check_outputs, check_spec_axes, in_spec_errors
from ._infer import run_infer
from ._route import checked_lax, manual_axes
from ._walk import exception_source, function_source, located


def _signature_key(args: Any) -> Any:
    leaves, tree = jax.tree_util.tree_flatten(args)
    return tree, tuple(str(jax.typeof(leaf)) if hasattr(leaf, "shape") else repr(leaf)
                       for leaf in leaves)


def typed_shard_map(f: Callable[..., Any] | None = None, /, *, mesh: Any, in_specs: Any,
                    out_specs: Any, axis_names: Any = frozenset(),
                    check_vma: bool = True) -> Any:
    """`jax.shard_map` for an existing raw per-shard function, with spmdtyped's checks.

    `f` is unchanged: it receives and returns raw JAX values. Its collectives, outputs and
    inputs are checked (see the module docs); the executed program is `jax.shard_map`'s.
    Decorator form too. With `check_vma=False` it is plain `jax.shard_map`.

    **Arguments:** as `jax.shard_map`.

    **Returns:** the shard-mapped function (global arrays in, global arrays out).

    **Raises:** on the first call with a given input signature, the first `SpmdTypeError`:
    SPMD1xx/2xx/3xx at the user's line (`err.source`), SPMD401/402/403 at the boundary,
    SPMD501 for unknown axes.

    !!! Example
        ```python
        step = st.adapters.typed_shard_map(raw_step, mesh=mesh,
                                           in_specs=(P(), P("dp")), out_specs=P())
        loss = step(params, batch)
        ```
    """
    if f is None:
        return functools.partial(typed_shard_map, mesh=mesh, in_specs=in_specs,
                                 out_specs=out_specs, axis_names=axis_names, check_vma=check_vma)
    mesh_axes = _compat.mesh_axis_names(mesh)
    manual = manual_axes(mesh, axis_names)
    name = getattr(f, "__name__", repr(f))
    where = f"typed_shard_map({name})"
    check_spec_axes(in_specs, mesh_axes, where, "in_specs")
    check_spec_axes(out_specs, mesh_axes, where, "out_specs")

    def body(*args: Any) -> Any:
        try:
            with checked_lax():
                out = f(*args)
        except SpmdTypeError as e:
            raise located(e, exception_source(e)) from None
        if check_vma and _compat.check_vma_enabled():
            try:
                check_outputs(out, out_specs, manual, where)
            except SpmdTypeError as e:
                raise located(e, function_source(f)) from None
        return out

    functools.update_wrapper(body, f)
    smapped = _compat.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                axis_names=axis_names, check_vma=check_vma)
    checked: set[Any] = set()

    @functools.wraps(f)
    @error_context(function=name, mesh=mesh, manual=manual)
    def wrapped(*args: Any) -> Any:
        check_in_structure(in_specs, args, where, "typed_shard_map")
        with in_spec_errors(where, "typed_shard_map"):
            if check_vma:
                key = _signature_key(args)
                if key not in checked:
                    # the jaxpr walk reports violations in program order (a routed collective
                    # could only report a later consequence of, e.g., a cumsum of an
                    # Unreduced value); routing takes over where JAX rejects the program
                    rep = run_infer(f, args, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                    axis_names=axis_names, where=where)
                    if rep.violations:
                        raise rep.violations[0]
                    checked.add(key)
            return smapped(*args)

    wrapped.__wrapped_shard_map__ = smapped  # type: ignore[attr-defined]
    return wrapped
