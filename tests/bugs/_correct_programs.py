"""Correct programs that the rules of issue 15 as written would reject (false-positive risks).

Each entry of `PROGRAMS` is `(run, reference, make_inputs, rule)`: `run` computes the value on
the mesh, `reference` on one device, and `rule` names the rule of the issue's "What to build"
that rejects it. `tests/test_bug_suite.py` proves every one computes the right numbers; the
rule builders must accept them (or give the opt-out named in docs/design/shard_partial.md).
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from bugs._common import make_mesh, normal

mesh = make_mesh({"dp": 2, "tp": 4})
mesh_dp = make_mesh({"dp": 8})


# 1. Row-parallel bias pre-divided by the tp size (PaddlePaddle/FastDeploy#5247 loads the bias
#    divided by tp_size and adds it before the all-reduce). Rule 3: Partial + Invariant.
def _bias_prescaled_body(h, w2, b):
    return lax.psum(h @ w2 + b / lax.axis_size("tp"), "tp")


bias_prescaled = jax.jit(jax.shard_map(
    _bias_prescaled_body, mesh=mesh, in_specs=(P("dp", "tp"), P("tp", None), P()),
    out_specs=P("dp", None)))


def _bias_inputs():
    return normal(200, (4, 16)), normal(201, (16, 8)), normal(202, (8,))


# 2. Split-KV decoding (flash-decoding) with the keys sharded over tp: local max and local sum,
#    rescaled by exp(m - pmax(m)), then reduced. Needs Partial x plain -> plain (not an error):
#    `den * alpha` and `o * alpha` scale each device's partial by its own factor.
def _split_kv_body(q, k, v):
    s = q @ k.T                                     # [1, keys]: keys Shard(tp, -1)
    m = jnp.max(s, axis=-1, keepdims=True)           # local max: plain
    p = jnp.exp(s - m)
    den, o = jnp.sum(p, axis=-1, keepdims=True), p @ v  # sum, contraction over Shard: Partial
    alpha = jnp.exp(m - lax.pmax(m, "tp"))            # per-device factor: plain
    return lax.psum(o * alpha, "tp") / lax.psum(den * alpha, "tp")


split_kv = jax.jit(jax.shard_map(
    _split_kv_body, mesh=mesh, in_specs=(P(), P("tp", None), P("tp", None)), out_specs=P()))


def _split_kv_inputs():
    return normal(210, (1, 4)), normal(211, (16, 4)), normal(212, (16, 4))


def _split_kv_ref(q, k, v):
    return jax.nn.softmax(q @ k.T, axis=-1) @ v


# 3. Block-diagonal preconditioner with blocks = shards (Distributed-Shampoo-style blocking):
#    G_blk^T G_blk contracts the tp-sharded row dim on purpose, then a non-linear inverse root.
#    Rules 2 + 3: the contraction gives Partial, the inverse root of a Partial is an error.
def _block_precond_body(g):
    gram = g.T @ g + 1e-3 * jnp.eye(g.shape[1])     # this shard's block: local on purpose
    w, u = jnp.linalg.eigh(gram)
    return (g @ (u * w ** -0.25) @ u.T)


block_precond = jax.jit(jax.shard_map(
    _block_precond_body, mesh=mesh, in_specs=P("tp", None), out_specs=P("tp", None)))


def _block_precond_inputs():
    return (normal(220, (16, 4)),)


def _block_precond_ref(g):
    blocks = []
    for blk in jnp.split(g, 4, axis=0):
        w, u = jnp.linalg.eigh(blk.T @ blk + 1e-3 * jnp.eye(g.shape[1]))
        blocks.append(blk @ (u * w ** -0.25) @ u.T)
    return jnp.concatenate(blocks, axis=0)


# 4. Largest per-shard gradient norm (a diagnostic, or per-shard clipping on purpose).
#    Rule 3: sqrt of a Partial.
def _max_shard_norm_body(g):
    return lax.pmax(jnp.sqrt(jnp.sum(g * g)), "tp")


max_shard_norm = jax.jit(jax.shard_map(
    _max_shard_norm_body, mesh=mesh, in_specs=P("tp", None), out_specs=P()))


def _max_shard_norm_ref(g):
    return jnp.max(jnp.stack([jnp.linalg.norm(b) for b in jnp.split(g, 4, axis=0)]))


# 5. Per-device partial sums that left a shard_map stacked (out_specs P("dp"), the way a Partial
#    leaves) and come back in with in_specs P("dp"): typed Shard(dp, 0), but a stack of partial
#    sums, whose psum is the total. Rule 4: psum of a Shard over its own axis.
def _partials_body(x):
    return x[None] * (lax.axis_index("dp") + 1.0)    # per-device partial contributions


def _total_body(stacked):
    return lax.psum(stacked[0], "dp")


_partials = jax.shard_map(_partials_body, mesh=mesh_dp, in_specs=P(), out_specs=P("dp"))
_total = jax.shard_map(_total_body, mesh=mesh_dp, in_specs=P("dp"), out_specs=P())
stacked_partials = jax.jit(lambda x: _total(_partials(x)))


def _stacked_inputs():
    return (normal(230, (3,)),)


def _stacked_ref(x):
    return x * sum(range(1, 9))


# 6. Total gradient written as vmap(grad) then a sum over the local examples: JAX's psum of
#    the per-example gradients over dp makes the local sum the global total, which is right.
#    Rule 5: st.grad under vmap of a Varying loss w.r.t. an Invariant argument.
def _net(p, x):
    return jnp.sin(jnp.dot(p, x))


def _vmap_grad_sum_body(params, xs):
    return jnp.sum(jax.vmap(jax.grad(_net), in_axes=(None, 0))(params, xs), axis=0)


vmap_grad_sum = jax.jit(jax.shard_map(
    _vmap_grad_sum_body, mesh=mesh_dp, in_specs=(P(), P("dp", None)), out_specs=P()))


def _vmap_inputs():
    return normal(240, (3,)), normal(241, (16, 3))


def _vmap_ref(params, xs):
    return jax.grad(lambda p: jnp.sum(jax.vmap(_net, in_axes=(None, 0))(p, xs)))(params)


# name -> (per-device body, mesh, in_specs, out_specs, inputs of that body): what infer walks.
BODIES = {
    "bias_prescaled": (_bias_prescaled_body, mesh, (P("dp", "tp"), P("tp", None), P()),
                       P("dp", None), _bias_inputs),
    "split_kv_decode": (_split_kv_body, mesh, (P(), P("tp", None), P("tp", None)), P(),
                        _split_kv_inputs),
    "block_preconditioner": (_block_precond_body, mesh, P("tp", None), P("tp", None),
                             _block_precond_inputs),
    "max_shard_norm": (_max_shard_norm_body, mesh, P("tp", None), P(),
                       lambda: (normal(250, (16, 8)),)),
    "stacked_partials": (_total_body, mesh_dp, P("dp"), P(),
                         lambda: (_partials(*_stacked_inputs()),)),
    "vmap_grad_sum": (_vmap_grad_sum_body, mesh_dp, (P(), P("dp", None)), P(), _vmap_inputs),
}

PROGRAMS = {
    "bias_prescaled": (bias_prescaled, lambda h, w2, b: h @ w2 + b, _bias_inputs,
                       "3: Partial + Invariant -> error"),
    "split_kv_decode": (split_kv, _split_kv_ref, _split_kv_inputs,
                        "3: Partial x plain is unlisted; must be plain, not an error"),
    "block_preconditioner": (block_precond, _block_precond_ref, _block_precond_inputs,
                             "2+3: contraction over Shard -> Partial; eigh/pow of Partial"),
    "max_shard_norm": (max_shard_norm, _max_shard_norm_ref, (lambda: (normal(250, (16, 8)),)),
                       "3: sqrt of a Partial"),
    "stacked_partials": (stacked_partials, _stacked_ref, _stacked_inputs,
                         "4: psum of a Shard over its own axis"),
    "vmap_grad_sum": (vmap_grad_sum, _vmap_ref, _vmap_inputs,
                      "5: grad under vmap w.r.t. an Invariant argument"),
}
