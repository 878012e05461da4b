"""The equinox block of tests/typing/pass_llama_eqx.py (jnp / jax.nn / jax.lax inside, state
hints on fields, methods and the step; mypy with the plugin reports nothing on it and each of
the three mistakes of fail_llama_eqx.py at its line, `test_typing.py`) computes what a single
device computes: the loss and the gradient of the row-parallel weight, against tests/_llama.py's
block on one device, on a (dp: 2, tp: 4) mesh. Under check_vma=False JAX tracks no state, so the
runtime refuses the jnp code on typed values (SPMD202, naming the st.numpy form). The flax nnx
block of pass_llama_nnx.py (unannotated `__call__` and helper method, `nnx.Param` fields) too:
its step's loss and updated weights equal one device's."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import _llama as L
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st

sys.path.insert(0, str(Path(__file__).parent / "typing"))
import pass_llama_eqx as M  # noqa: E402
import pass_llama_nnx as N  # noqa: E402

COL, ROW = P(None, "tp"), P("tp", None)


def _block(p: dict[str, Any]) -> M.Block:
    return M.Block(p["g1"], p["g2"], M.Attention(p["wq"], p["wk"], p["wv"], p["wo"]),
                   M.MLP(p["w_gate"], p["w_up"], p["w_down"], p["b_down"]))


SPECS = M.Block(P(), P(), M.Attention(COL, COL, COL, ROW), M.MLP(COL, COL, ROW, P()))


def _reference(p: dict[str, Any], x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """tests/_llama.py's block on one device: the mean square loss and d loss / d w_down."""
    def f(w_down: jax.Array) -> jax.Array:
        return jnp.mean(L.block({**p, "w_down": w_down}, x) ** 2)
    return jax.value_and_grad(f)(p["w_down"])


def _inputs(mesh: Any) -> tuple[dict[str, Any], jax.Array, M.Block, jax.Array]:
    p = L.block_params(jax.random.key(3))
    x = jax.random.normal(jax.random.key(4), (4, L.SEQ, L.D), jnp.float32)
    block = jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(mesh, s)), _block(p), SPECS)
    return p, x, block, jax.device_put(x, NamedSharding(mesh, P("dp")))


def test_typed_block_equals_one_device(mesh_dp_tp: Any) -> None:
    p, x, block, xs = _inputs(mesh_dp_tp)
    want_loss, want_grad = _reference(p, x)
    step = st.shard_map(M.step, mesh=mesh_dp_tp, in_specs=(SPECS, P("dp")), out_specs=(P(), ROW))
    loss, grad = step(block, xs)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-6)
    assert np.abs(np.asarray(want_grad)).max() > 1e-3  # a gradient that can be wrong


def test_without_check_vma_the_jnp_code_is_refused(mesh_dp_tp: Any) -> None:
    _, _, block, xs = _inputs(mesh_dp_tp)
    step = st.shard_map(M.step, mesh=mesh_dp_tp, in_specs=(SPECS, P("dp")),
                        out_specs=(P(), ROW), check_vma=False)
    with pytest.raises(st.SpmdTypeError) as e:
        step(block, xs)
    assert e.value.code == "SPMD202"
    assert "check_vma=False" in str(e.value) and "st.numpy." in str(e.value)


def test_typed_nnx_block_equals_one_device(mesh_dp_tp: Any) -> None:
    p = L.block_params(jax.random.key(3))
    x = jax.random.normal(jax.random.key(4), (4, L.SEQ, L.D), jnp.float32)
    specs = N.Block(P(), P(), N.Attention(COL, COL, COL, ROW), N.MLP(COL, COL, ROW, P()))
    block = N.Block(p["g1"], p["g2"], N.Attention(p["wq"], p["wk"], p["wv"], p["wo"]),
                    N.MLP(p["w_gate"], p["w_up"], p["w_down"], p["b_down"]))
    block = jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(mesh_dp_tp, s)), block, specs)
    step = st.shard_map(N.step, mesh=mesh_dp_tp, in_specs=(specs, P("dp")), out_specs=(P(), specs))
    loss, new = step(block, jax.device_put(x, NamedSharding(mesh_dp_tp, P("dp"))))
    want_loss, want = jax.value_and_grad(lambda q: jnp.mean(L.block(q, x) ** 2))(p)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-6)
    for got, k in ((new.mlp.w_down, "w_down"), (new.mlp.b_down, "b_down"), (new.attn.wq, "wq"),
                   (new.attn.wo, "wo"), (new.g2, "g2")):
        np.testing.assert_allclose(got[...], p[k] - 0.1 * want[k], rtol=1e-4, atol=1e-6, err_msg=k)
    assert np.abs(np.asarray(want["w_down"])).max() > 1e-3  # a gradient that can be wrong
