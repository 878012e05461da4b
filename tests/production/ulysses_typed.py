"""The typed twin of `ulysses.py`'s block: the same attention written with spmdtyped's
collectives, whose specs `st.shard_map` derives from hints instead of hand-written
PartitionSpec trees (the parameters' from their field hints, the activations' from the
dimensions their hints name)."""

import equinox as eqx
import jax
import jax.numpy as jnp

import spmdtyped as st
from spmdtyped import Invariant, Varying

from .ulysses import causal_attention, rms_norm

Act = st.Float[Varying["dp", "sp"], "b/dp s/sp d"]


class Attention(eqx.Module):
    scale: Invariant                 # P()
    wq: st.Shard["tp", 1]            # heads over tp: P(None, "tp", None)
    wk: st.Shard["tp", 1]
    wv: st.Shard["tp", 1]
    wo: st.Shard["tp", 0]            # P("tp", None, None)

    @classmethod
    def of(cls, params):
        a = params["attn"]
        return cls(params["norm"]["scale"], a["wq"], a["wk"], a["wv"], a["wo"])


def block(attn: Attention, x: Act) -> Act:
    h = rms_norm(x, attn.scale)
    q, k, v = (jnp.einsum("bsd,dhk->bshk", h, w) for w in (attn.wq, attn.wk, attn.wv))
    q, k, v = (st.all_to_all(t, "sp", 2, 1, tiled=True) for t in (q, k, v))
    o = st.all_to_all(causal_attention(q, k, v), "sp", 1, 2, tiled=True)
    return x + st.psum(jnp.einsum("bshk,hkd->bsd", o, attn.wo), "tp")


def loss_fn(params, batch, mesh):
    x, target = (jax.sharding.reshard(a, jax.sharding.PartitionSpec("dp", "sp", None))
                 for a in batch)
    y = st.shard_map(block, mesh=mesh)(Attention.of(params), x)   # no in_specs, no out_specs
    return jnp.mean((y - target) ** 2), y


def step(mesh, params, batch):
    """(loss, the activations), the gradients: as `ulysses.step`'s."""
    with jax.set_mesh(mesh):
        return jax.jit(jax.value_and_grad(loss_fn, has_aux=True), static_argnums=2)(
            params, batch, mesh)
