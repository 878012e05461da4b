"""Data parallelism ported from `pmap`: the loss is this device's, its gradient is taken inside
the shard_map, and the gradient is averaged with `jax.lax.pmean(g, "dp")`. Under JAX's typed
manual axes the parameter is replicated over dp, so the backward pass already reduces its
gradient: it is the SUM of the devices' gradients, the pmean does nothing, and the step is n
times too large (8 on this mesh: measured against one device below). spmdtyped reports the
pmean (SPMD103) on every face; its fix must not be "drop the pmean" alone, which keeps the
sum: it says to average the loss. The fixed step equals one device.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import on_face
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import Varying

FACES = ["typed_shard_map", "checking", "st.shard_map"]
W = jnp.linspace(-0.5, 0.5, 16).reshape(4, 4)
X = jax.random.normal(jax.random.key(70), (16, 4))


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((8,), ("dp",))


def _ported(w, x):
    g = jax.grad(lambda w: jnp.mean((x @ w) ** 2))(w)
    return jax.lax.pmean(g, "dp")  # the pmean's line


def _fixed(w, x):
    return jax.grad(lambda w: jax.lax.pmean(jnp.mean((x @ w) ** 2), "dp"))(w)


def _run(face, body, mesh):
    def hinted(w, x: Varying["dp"]):
        return body(w, x)
    program = on_face(face, body, hinted, mesh=mesh, in_specs=(P(), P("dp")), out_specs=P())
    return program(jax.device_put(W, NamedSharding(mesh, P())),
                   jax.device_put(X, NamedSharding(mesh, P("dp"))))


def _one_device():
    return jax.grad(lambda w: jnp.mean((X @ w) ** 2))(W)


@pytest.mark.parametrize("face", FACES)
def test_pmean_of_a_summed_gradient_says_to_average_the_loss(face, mesh):
    with pytest.raises(st.SpmdTypeError) as e:
        _run(face, _ported, mesh)
    assert e.value.code == "SPMD103", str(e.value)
    assert "is the SUM over 'dp'" in e.value.fix and "average the loss" in e.value.fix
    with open(__file__) as f:
        line = next(n for n, text in enumerate(f, 1) if text.rstrip().endswith("# the pmean's line"))
    assert (e.value.file, e.value.line) == (__file__, line)


def test_the_ported_step_is_n_times_too_large(mesh):
    got = np.asarray(_run("jax", _ported, mesh))
    np.testing.assert_allclose(got, 8 * np.asarray(_one_device()), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("face", [*FACES, "jax"])
def test_the_averaged_loss_equals_one_device(face, mesh):
    np.testing.assert_allclose(np.asarray(_run(face, _fixed, mesh)), np.asarray(_one_device()),
                               rtol=1e-4, atol=1e-6)
