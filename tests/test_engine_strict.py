"""`st.shard_map(..., strict=True)` (issue 27): where the engine cannot follow a value (a host
callback, a primitive with no refinement rule), an `UnfollowedWarning` names the primitive,
the reason and the user's line; the default is quiet."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped._engine.check import UnfollowedWarning

mesh = jax.make_mesh((8,), ("dp",), axis_types=(AxisType.Auto,))


def body(x):
    y = jax.pure_callback(lambda a: np.asarray(a) * 2, jax.ShapeDtypeStruct(x.shape, x.dtype),
                          x, vmap_method="sequential")
    v, _ = jax.lax.approx_max_k(jax.lax.pcast(y, "dp", to="varying"), 2)
    return v


CALLBACK_LINE = body.__code__.co_firstlineno + 1
TOPK_LINE = body.__code__.co_firstlineno + 3


def _run(strict):
    f = st.shard_map(lambda x: body(st.unwrap(x)), mesh=mesh, in_specs=P("dp"),
                     out_specs=P("dp"), strict=strict)
    return jax.jit(f)(jnp.arange(32.0).reshape(8, 4))


def test_strict_reports_what_the_engine_cannot_follow():
    with pytest.warns(UnfollowedWarning) as rec:
        out = _run(True)
    assert out.shape == (8, 2)
    msgs = [str(w.message) for w in rec]
    assert any("callback" in m and f":{CALLBACK_LINE}:" in m for m in msgs), msgs
    assert any("approx_top_k" in m and f":{TOPK_LINE}:" in m and "no refinement rule" in m
               for m in msgs), msgs


def test_default_is_quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnfollowedWarning)
        _run(False)
