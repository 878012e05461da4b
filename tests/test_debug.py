"""`st.debug.print`: an Invariant value once, Varying ones once per index, labelled."""

import jax
import jax.numpy as jnp
from _helpers import put
from jax.sharding import PartitionSpec as P

import spmdtyped as st


def _lines(capfd, mesh, body, x, spec):
    jax.jit(st.shard_map(body, mesh=mesh, in_specs=spec, out_specs=P()))(put(mesh, x, spec))
    jax.effects_barrier()
    return sorted(line for line in capfd.readouterr().out.splitlines() if line)


def test_invariant_prints_once(capfd, mesh_dp_tp):
    def body(x):
        total = st.psum(x.sum(), "dp")
        st.debug.print("total {}", total)
        return total

    x = jnp.arange(8.0)
    assert _lines(capfd, mesh_dp_tp, body, x, P("dp")) == ["total 28.0"]


def test_varying_prints_once_per_index_labelled(capfd, mesh_dp_tp):
    def body(x):
        st.debug.print("local {} of {}", x.sum(), 2)
        return st.psum(x.sum(), "dp")

    assert _lines(capfd, mesh_dp_tp, body, jnp.arange(8.0), P("dp")) == [
        "[dp=0] local 6.0 of 2", "[dp=1] local 22.0 of 2"]


def test_two_varying_axes_and_outside_shard_map(capfd, mesh_dp_tp):
    def body(x):
        st.debug.print("{x}", x=x[0, 0])
        return st.psum(st.psum(x[0, 0], "dp"), "tp")

    lines = _lines(capfd, mesh_dp_tp, body, jnp.arange(8.0).reshape(2, 4), P("dp", "tp"))
    assert lines == [f"[dp={i} tp={j}] {float(4 * i + j)}" for i in range(2) for j in range(4)]
    st.debug.print("plain {}", jnp.float32(1.5))
    jax.effects_barrier()
    assert capfd.readouterr().out.strip() == "plain 1.5"
