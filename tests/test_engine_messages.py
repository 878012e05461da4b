"""Messages that locate the bug (issue 27): a boundary error names the output and its pytree
path; an output that lacks its reduction is reported at the projection whose psum is missing
(the cause), not as "psum the loss"."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import spmdtyped as st

mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)


def test_boundary_error_names_the_output_path():
    def body(x):
        return {"loss": jnp.ones(()), "blocks": [{"b": jnp.ones(2)}, {"b": x[0]}]}

    specs = {"loss": P(), "blocks": [{"b": P()}, {"b": P()}]}
    f = st.shard_map(body, mesh=mesh, in_specs=P("dp"), out_specs=specs)
    with pytest.raises(st.SpmdTypeError) as ei:
        jax.jit(f)(jnp.ones((8, 2)))
    e = ei.value
    assert e.code == "SPMD401"
    assert "out['blocks'][1]['b']" in str(e), str(e)


def test_missing_psum_reported_at_the_projection():
    def body(x, w1, w2, b):
        h = jax.nn.relu(x @ w1)
        return h @ w2 + b            # the psum over tp forgotten

    f = st.shard_map(body, mesh=mesh, in_specs=(P("dp"), P(None, "tp"), P("tp"), P()),
                     out_specs=P("dp"))
    with pytest.raises(st.SpmdTypeError) as ei:
        jax.jit(f)(jnp.ones((8, 4)), jnp.ones((4, 8)), jnp.ones((8, 4)), jnp.ones(4))
    e = ei.value
    assert (e.code, e.line) == ("SPMD210", body.__code__.co_firstlineno + 2), str(e)
    assert "st.psum(x, 'tp') + b" in e.fix
    assert e.__cause__ is not None and e.__cause__.code == "SPMD401"
