"""Mixture of experts: one expert per tp device, tokens dispatched and combined with
all_to_all, plus a load-balancing loss."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

E = 4  # experts = tp devices
IN_SPECS = (P("dp", "tp", None), P(), P("tp"))
OUT_SPECS = (P("dp", "tp", None), P())


def _experts(x, wr, we):
    b, t, d = x.shape
    tokens = x.reshape(-1, d)
    gate = jax.nn.softmax(tokens @ wr, axis=-1)
    # fixed dispatch for the sketch: token i goes to expert i % E
    disp = tokens.reshape(-1, E, d).transpose(1, 0, 2)
    recv = lax.all_to_all(disp, "tp", 0, 0, tiled=True)
    h = jnp.tanh(recv @ we[0])
    back = lax.all_to_all(h, "tp", 0, 0, tiled=True).transpose(1, 0, 2).reshape(-1, d)
    chosen = gate[jnp.arange(tokens.shape[0]), jnp.arange(tokens.shape[0]) % E]
    return (back * chosen[:, None]).reshape(b, t, d), gate


def moe(x, wr, we):
    out, gate = _experts(x, wr, we)
    load = lax.pmean(jnp.mean(gate, axis=0), ("dp", "tp"))
    return out, E * jnp.sum(load * load)


def moe_bug_double_count(x, wr, we):
    out, gate = _experts(x, wr, we)
    all_gates = lax.all_gather(gate, ("dp", "tp"), tiled=True, to="invarying")
    load = lax.psum(jnp.mean(all_gates, axis=0), ("dp", "tp"))  # BUG: SPMD103
    return out, E * jnp.sum(load * load)


BUGS = {"moe_bug_double_count": (IN_SPECS, OUT_SPECS)}
MAIN = "moe"


def build(mesh):
    return jax.shard_map(moe, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS)


def make_args(mesh):
    k = jax.random.split(jax.random.key(7), 3)
    raw = (jax.random.normal(k[0], (4, 16, 8)), jax.random.normal(k[1], (8, E)),
           0.3 * jax.random.normal(k[2], (E, 8, 8)))
    return tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(raw, IN_SPECS, strict=True))
