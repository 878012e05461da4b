"""Asynchronous collectives (jax 0.12: `jax.lax.psum_scatter_start(...)` returns a future whose
`.done()` is the result; `psum_start`, `all_gather_start`, `all_to_all_start` and
`ppermute_start` are in `jax._src.lax.parallel`, as JAX's own `tests/overlap_test.py` uses
them). Each start is its collective's row (`_surface.collectives`: the same params, the same
rule) and each `done` passes the value on (`_rules.primitives.ASYNC_DONES`).

Found by running JAX's `overlap_test.py` through `typed_shard_map`: every async start was an
opaque computation (SPMD408 where JAX types the result Reduced). Here, the way serving code
overlaps communication: a tensor-parallel MLP whose row-parallel output is reduce-scattered
over the sequence while the next computation runs, on a dp x tp mesh, under `jax.jit`. The
right program equals one device on `typed_shard_map`, `checking(step)` and raw JAX, and
`infer` reports nothing; the bias added before the reduce-scatter is SPMD210 at its line on
the three faces and wrong in raw JAX. The collectives are not differentiable in JAX (no JVP
rule), so only forward programs are tested. Skipped where JAX has no async collectives
(jax 0.10).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped.adapters import checking, infer, typed_shard_map

pytestmark = pytest.mark.skipif(not hasattr(jax.lax, "psum_scatter_start"),
                                reason="no asynchronous collectives in this JAX version")


def _parallel():   # JAX's own spelling of the other starts (tests/overlap_test.py)
    from jax._src.lax import parallel
    return parallel


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def _inputs(mesh):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8, 16)).astype(np.float32)     # batch, seq, d
    w1 = rng.standard_normal((16, 32)).astype(np.float32) / 4
    w2 = rng.standard_normal((32, 16)).astype(np.float32) / 6
    b = rng.standard_normal((16,)).astype(np.float32)

    def on(a, spec):
        return jax.device_put(a, NamedSharding(mesh, spec))

    return (on(x, P("dp")), on(w1, P(None, "tp")), on(w2, P("tp", None)), on(b, P())), \
        (x, w1, w2, b)


SPECS = (P("dp"), P(None, "tp"), P("tp", None), P())
OUT = P("dp", "tp")    # the output's sequence reduce-scattered over tp


def mlp(x, w1, w2, b):
    h = jax.nn.gelu(x @ w1)                                   # column-parallel
    pending = jax.lax.psum_scatter_start(h @ w2, "tp", scatter_dimension=1, tiled=True)
    # while it is reduced: this device's rows of the residual stream
    rows = x.shape[1] // jax.lax.axis_size("tp")
    residual = jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index("tp") * rows, rows, axis=1)
    return residual + pending.done() + b


def mlp_bias_inside(x, w1, w2, b):
    h = jax.nn.gelu(x @ w1)
    pending = jax.lax.psum_scatter_start(h @ w2 + b, "tp", scatter_dimension=1, tiled=True)  # BUG
    return pending.done()


def reference(x, w1, w2, b):
    return x + jax.nn.gelu(x @ w1) @ w2 + b


def _bug_line() -> int:
    import inspect
    lines, start = inspect.getsourcelines(mlp_bias_inside)
    return start + next(i for i, text in enumerate(lines) if "# BUG" in text)


def _faces(body, mesh):
    def step(*args):
        return jax.shard_map(body, mesh=mesh, in_specs=SPECS, out_specs=OUT)(*args)

    return {"typed_shard_map": jax.jit(typed_shard_map(body, mesh=mesh, in_specs=SPECS,
                                                       out_specs=OUT)),
            "checking": checking(jax.jit(step)), "raw": jax.jit(step)}


def test_reduce_scatter_started_early_equals_one_device(mesh):
    args, host = _inputs(mesh)
    want = np.asarray(reference(*host))
    for name, face in _faces(mlp, mesh).items():
        np.testing.assert_allclose(np.asarray(face(*args)), want, rtol=2e-5, atol=2e-5,
                                   err_msg=name)
    assert not infer(mlp, *args, mesh=mesh, in_specs=SPECS, out_specs=OUT).violations


def test_bias_before_the_reduce_scatter_start(mesh):
    args, host = _inputs(mesh)
    faces = _faces(mlp_bias_inside, mesh)
    got = np.asarray(faces.pop("raw")(*args))
    x, w1, w2, b = host
    right = np.asarray(jax.nn.gelu(x @ w1) @ w2 + b)
    assert not np.allclose(got, right, atol=1e-3)   # b added once per tp device
    np.testing.assert_allclose(got, right + 3 * b, rtol=2e-5, atol=2e-5)
    for name, face in faces.items():
        with pytest.raises(st.SpmdTypeError) as ei:
            face(*args)
        assert (name, ei.value.code, ei.value.line) == (name, "SPMD210", _bug_line()), ei.value
    found = infer(mlp_bias_inside, *args, mesh=mesh, in_specs=SPECS, out_specs=OUT).violations
    assert [(v.code, v.line) for v in found][:1] == [("SPMD210", _bug_line())]


@pytest.mark.parametrize("name", ["psum", "all_gather", "all_gather_reduced", "all_to_all",
                                  "ppermute", "psum_of_psum"])
def test_each_start_is_its_collective(name):
    """Each async start gives what its synchronous collective gives, on `typed_shard_map` as in
    raw JAX (on an Explicit mesh: `to="reduced"` needs one); a start of a value already summed
    is SPMD103, as the synchronous psum is."""
    par = _parallel()
    if not hasattr(par, "psum_start"):
        pytest.skip("JAX's private async starts are not there")
    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    x = jax.device_put(jnp.arange(64.0).reshape(8, 8), NamedSharding(mesh, P("tp")))
    pairs = {
        "psum": (lambda v: par.psum_start(v, "tp").done(), lambda v: jax.lax.psum(v, "tp"), P()),
        "all_gather": (lambda v: par.all_gather_start(v, "tp", tiled=True).done(),
                       lambda v: jax.lax.all_gather(v, "tp", tiled=True), P("tp")),
        "all_gather_reduced": (
            lambda v: par.all_gather_start(v, "tp", tiled=True, to="reduced").done(),
            lambda v: jax.lax.all_gather(v, "tp", tiled=True, to="reduced"),
            P(None, reduced={"tp"})),
        "all_to_all": (
            lambda v: par.all_to_all_start(v, "tp", split_axis=1, concat_axis=0,
                                           tiled=True).done(),
            lambda v: jax.lax.all_to_all(v, "tp", split_axis=1, concat_axis=0, tiled=True),
            P("tp")),
        "ppermute": (lambda v: par.ppermute_start(v, "tp", [(i, (i + 1) % 4) for i in range(4)]).done(),
                     lambda v: jax.lax.ppermute(v, "tp", [(i, (i + 1) % 4) for i in range(4)]),
                     P("tp")),
        "psum_of_psum": (lambda v: par.psum_start(jax.lax.psum(v, "tp"), "tp").done(), None, P()),
    }
    start, sync, out = pairs[name]
    typed = jax.jit(typed_shard_map(start, mesh=mesh, in_specs=P("tp"), out_specs=out))
    if sync is None:
        with pytest.raises(st.SpmdTypeError) as ei:
            typed(x)
        assert ei.value.code == "SPMD103"
        return
    want = jax.jit(jax.shard_map(sync, mesh=mesh, in_specs=P("tp"), out_specs=out))(x)
    np.testing.assert_array_equal(np.asarray(typed(x)), np.asarray(want))
    assert not infer(start, x, mesh=mesh, in_specs=P("tp"), out_specs=out).violations
