"""`port --enable-vma`: one shard_map body traced with JAX's checks on, its gradient too
(`trace_job`); what JAX raises is what the migration edits (`vma.migrate`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ... import _compat
from .._infer import abstract_args


def trace_job(job: Any) -> BaseException | None:
    """Trace one shard_map body (`job`: `fn`, `args`, `mesh`, `in_specs`, `out_specs`,
    `axis_names`) with JAX's checks on, and its gradient (`pullback`: JAX checks the
    backward program as well, a `custom_vjp`'s own `bwd` included) where the body is
    differentiable with the checks off; the exception JAX raises, or None."""
    sds = abstract_args(job.args, job.in_specs, job.mesh)

    def smap(check_vma: bool) -> Any:
        return _compat.shard_map(job.fn, mesh=job.mesh, in_specs=job.in_specs,
                                 out_specs=job.out_specs, axis_names=job.axis_names,
                                 check_vma=check_vma)

    try:
        jax.make_jaxpr(smap(True))(*sds)
    except Exception as e:  # noqa: BLE001 - JAX's verdict is the result
        return e
    try:
        jax.make_jaxpr(pullback(smap(True), sds))(*sds)
    except Exception as e:  # noqa: BLE001 - JAX's verdict on the backward program
        try:   # (a body that is not differentiable anyway: nothing the checks change)
            jax.make_jaxpr(pullback(smap(False), sds))(*sds)
        except Exception:  # noqa: BLE001
            return None
        e.add_note(IN_THE_GRADIENT)   # (the report says so: `_unfixed`)
        return e
    return None


#: the note `trace_job` adds to an error JAX raised tracing the gradient only
IN_THE_GRADIENT = "spmdtyped: raised tracing the gradient (jax.vjp of the shard_map)"


def pullback(f: Callable[..., Any], sds: Sequence[Any]) -> Callable[..., Any]:
    """`f`'s vector-Jacobian product with respect to its floating-point arguments, on ones
    for its floating-point outputs: a function of `f`'s arguments whose trace holds the
    backward program."""
    flat, tree = jax.tree_util.tree_flatten(tuple(sds))
    diff = [i for i, s in enumerate(flat) if _inexact(s)]

    def run(*args: Any) -> Any:
        values = jax.tree_util.tree_leaves(args)

        def on(*d: Any) -> Any:
            full = list(values)
            for i, x in zip(diff, d, strict=True):
                full[i] = x
            return f(*jax.tree_util.tree_unflatten(tree, full))

        out, vjp = jax.vjp(on, *(values[i] for i in diff))
        return vjp(jax.tree_util.tree_map(
            lambda o: jnp.ones_like(o) if _inexact(o) else np.zeros(o.shape, jax.dtypes.float0),
            out))

    return run


def _inexact(x: Any) -> bool:
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)
