"""Layers stacked and scanned, as production code writes them (a params dict whose leaves carry a
leading layer axis, `jax.lax.scan` over it, the layer under `jax.checkpoint` or not, or under
a remat policy that saves the activations tagged with `checkpoint_name` (MaxText's
`save_only_these_names`: the tag is a `name` equation the walks follow as a copy), a
row-parallel `jax.lax.psum` over tp inside the scanned body, `jax.value_and_grad` in the
step): under `st.shard_map` (hints at the step only), `st.adapters.typed_shard_map` and
`st.adapters.checking()`, the correct step equals one device in loss and every gradient; the
bias added before the psum inside the scanned layer is SPMD210 at its line, and raw JAX runs it
with a wrong loss."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import line_ending_with, on_face
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import Varying

LAYERS, D, F = 3, 8, 16
SPECS = {"w1": P(None, None, "tp"), "w2": P(None, "tp", None), "b": P()}


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 4), ("dp", "tp"))


def _inputs():
    k = jax.random.split(jax.random.key(50), 4)
    params = {"w1": jax.random.normal(k[0], (LAYERS, D, F)) / 3,
              "w2": jax.random.normal(k[1], (LAYERS, F, D)) / 4,
              "b": jnp.linspace(-0.3, 0.3, LAYERS * D).reshape(LAYERS, D)}
    return params, jax.random.normal(k[2], (8, D)), jax.random.normal(k[3], (8, D))


#: how the scanned layer is rematerialized: not, `jax.checkpoint`, or a policy saving the
#: activation tagged "hidden"
REMAT = {"scan": None, "scan_remat": jax.checkpoint,
         "scan_remat_policy": lambda f: jax.checkpoint(
             f, policy=jax.checkpoint_policies.save_only_these_names("hidden"))}


def forward(params, x, psum, *, bug=False, remat="scan"):
    def layer(h, p):
        u = checkpoint_name(jax.nn.relu(h @ p["w1"]), "hidden") @ p["w2"]
        if bug:
            return h + psum(u + p["b"]), None  # the scanned bias's line
        return h + psum(u) + p["b"], None

    wrap = REMAT[remat]
    h, _ = jax.lax.scan(layer if wrap is None else wrap(layer), x, params)
    return h


def _step(face, mesh, *, bug, remat):
    def step(params, x, y):
        def loss(p):
            h = forward(p, x, lambda v: jax.lax.psum(v, "tp"), bug=bug, remat=remat)
            return jax.lax.pmean(jnp.mean((h - y) ** 2), "dp")
        return jax.value_and_grad(loss)(params)

    def hinted(params, x: Varying["dp"], y: Varying["dp"]):
        return step(params, x, y)
    return on_face(face, step, hinted, mesh=mesh, in_specs=(SPECS, P("dp"), P("dp")),
                   out_specs=(P(), SPECS))


def _placed(mesh, params, x, y):
    put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))  # noqa: E731
    return jax.tree.map(put, params, SPECS), put(x, P("dp")), put(y, P("dp"))


def _single_device(params, x, y):
    return jax.value_and_grad(lambda p: jnp.mean((forward(p, x, lambda v: v) - y) ** 2))(params)


def _line(marker):
    return line_ending_with(__file__, marker)


FACES = ["st.shard_map", "typed_shard_map", "checking"]


@pytest.mark.parametrize("remat", sorted(REMAT))
@pytest.mark.parametrize("face", [*FACES, "jax"])
def test_correct_scanned_step_equals_one_device(face, remat, mesh):
    params, x, y = _inputs()
    loss, grads = _step(face, mesh, bug=False, remat=remat)(*_placed(mesh, params, x, y))
    ref_loss, ref_grads = _single_device(params, x, y)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("remat", sorted(REMAT))
@pytest.mark.parametrize("face", FACES)
def test_bias_before_the_psum_in_the_scanned_layer(face, remat, mesh):
    params, x, y = _inputs()
    with pytest.raises(st.SpmdTypeError) as e:
        _step(face, mesh, bug=True, remat=remat)(*_placed(mesh, params, x, y))
    assert e.value.code == "SPMD210", str(e.value)
    assert (e.value.file, e.value.line) == (__file__, _line("# the scanned bias's line"))


def test_the_scanned_bias_bug_is_real(mesh):
    params, x, y = _inputs()
    loss, _ = _step("jax", mesh, bug=True, remat="scan_remat_policy")(*_placed(mesh, params, x, y))
    ref_loss, _ = _single_device(params, x, y)
    assert not np.isclose(float(loss), float(ref_loss), rtol=1e-3)
