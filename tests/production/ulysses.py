"""Ulysses context parallelism on a 2 x 2 x 2 mesh (dp x sp x tp), as production code writes it:
the sequence is sharded over `sp`, the heads over `tp`; `jax.lax.all_to_all` over `sp` swaps
the sharded dimension from the sequence to the heads, each device attends over the whole
sequence for its heads, and the inverse all_to_all swaps back. The K/V variant gathers the
keys and values over `sp` instead (the ring's result, one collective). The loss is reduced in
a shard_map of its own, the gradient taken around both (`jax.value_and_grad` of the global
program), and the inputs are resharded by explicit-sharding code before the shard_map.
`check_vma=True` throughout."""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

AXES = (("dp", 2), ("sp", 2), ("tp", 2))
B, S, D, H, K = 4, 16, 32, 8, 4  # batch, sequence, model, heads, head dim

ACT = P("dp", "sp", None)
PARAM_SPECS = {"norm": {"scale": P()},
               "attn": {"wq": P(None, "tp", None), "wk": P(None, "tp", None),
                        "wv": P(None, "tp", None), "wo": P("tp", None, None)}}


def make_mesh():
    return jax.make_mesh(tuple(s for _, s in AXES), tuple(n for n, _ in AXES),
                         axis_types=(jax.sharding.AxisType.Explicit,) * len(AXES))


def make_params(key):
    k = jax.random.split(key, 4)
    w = lambda i, shape: jax.random.normal(k[i], shape) / jnp.sqrt(shape[0])  # noqa: E731
    return {"norm": {"scale": jnp.ones(D)},
            "attn": {"wq": w(0, (D, H, K)), "wk": w(1, (D, H, K)), "wv": w(2, (D, H, K)),
                     "wo": w(3, (H, K, D))}}


def make_batch(key):
    kx, kt = jax.random.split(key)
    return jax.random.normal(kx, (B, S, D)), jax.random.normal(kt, (B, S, D))


def rms_norm(x, scale):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def causal_attention(q, k, v):
    # q, k, v: [b, s, h, k] over the whole sequence
    scores = jnp.einsum("bqhk,bshk->bhqs", q, k) / jnp.sqrt(q.shape[-1])
    mask = jnp.tril(jnp.ones((q.shape[1], k.shape[1]), dtype=bool))
    scores = jnp.where(mask, scores, -1e30)
    return jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(scores, axis=-1), v)


def project(params, x):
    h = rms_norm(x, params["norm"]["scale"])
    a = params["attn"]
    return tuple(jnp.einsum("bsd,dhk->bshk", h, a[w]) for w in ("wq", "wk", "wv"))


def ulysses_block(params, x):
    # x: [b, s/sp, D]; q, k, v: [b, s/sp, H/tp, K]
    q, k, v = project(params, x)
    # heads <-> sequence: [b, S, H/(tp*sp), K]
    q, k, v = (jax.lax.all_to_all(t, "sp", 2, 1, tiled=True) for t in (q, k, v))
    o = causal_attention(q, k, v)
    o = jax.lax.all_to_all(o, "sp", 1, 2, tiled=True)  # back: [b, s/sp, H/tp, K]
    y = jnp.einsum("bshk,hkd->bsd", o, params["attn"]["wo"])
    return x + jax.lax.psum(y, "tp")


def gathered_kv_block(params, x):
    # every device keeps its queries and gathers the keys and values over sp
    q, k, v = project(params, x)
    k = jax.lax.all_gather(k, "sp", axis=1, tiled=True)
    v = jax.lax.all_gather(v, "sp", axis=1, tiled=True)
    s_local = q.shape[1]
    q_pos = jax.lax.axis_index("sp") * s_local + jnp.arange(s_local)
    scores = jnp.einsum("bqhk,bshk->bhqs", q, k) / jnp.sqrt(q.shape[-1])
    scores = jnp.where(q_pos[:, None] >= jnp.arange(k.shape[1])[None, :], scores, -1e30)
    o = jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(scores, axis=-1), v)
    y = jnp.einsum("bshk,hkd->bsd", o, params["attn"]["wo"])
    return x + jax.lax.psum(y, "tp")


def mse(y, target):
    return jax.lax.pmean(jnp.mean((y - target) ** 2), ("dp", "sp"))


# ------------------------------------------------------------------ seeded one-line bugs


def ulysses_block_no_psum(params, x):
    q, k, v = project(params, x)
    q, k, v = (jax.lax.all_to_all(t, "sp", 2, 1, tiled=True) for t in (q, k, v))
    o = causal_attention(q, k, v)
    o = jax.lax.all_to_all(o, "sp", 1, 2, tiled=True)
    y = jnp.einsum("bshk,hkd->bsd", o, params["attn"]["wo"])
    return x + y  # BUG: SPMD210


def gathered_kv_block_psum(params, x):
    q, k, v = project(params, x)
    k = jax.lax.all_gather(k, "sp", axis=1, tiled=True)
    v = jax.lax.psum(jax.lax.all_gather(v, "sp", axis=1, tiled=True), "sp")  # BUG: SPMD103
    s_local = q.shape[1]
    q_pos = jax.lax.axis_index("sp") * s_local + jnp.arange(s_local)
    scores = jnp.einsum("bqhk,bshk->bhqs", q, k) / jnp.sqrt(q.shape[-1])
    scores = jnp.where(q_pos[:, None] >= jnp.arange(k.shape[1])[None, :], scores, -1e30)
    o = jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(scores, axis=-1), v)
    y = jnp.einsum("bshk,hkd->bsd", o, params["attn"]["wo"])
    return x + jax.lax.psum(y, "tp")


def mse_psum_first(y, target):
    return jnp.mean(jax.lax.psum((y - target) ** 2, ("dp", "sp")))  # BUG: SPMD108


#: bug -> (the stage it replaces, the buggy body)
BUGS = {"no_psum": ("block", "ulysses_block_no_psum"),
        "psum_after_gather": ("block", "gathered_kv_block_psum"),
        "psum_of_sharded": ("loss", "mse_psum_first")}
SHARD_MAPS = 2  # per step
ENTRIES = ("ulysses_block", "gathered_kv_block")


# ------------------------------------------------------------------ the program


def place(mesh, params, batch):
    params = jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(mesh, s)), params,
                          PARAM_SPECS)
    return params, tuple(jax.device_put(a, NamedSharding(mesh, P("dp"))) for a in batch)


def loss_fn(params, batch, mesh, block, loss):
    x, target = batch
    x = jax.sharding.reshard(x, ACT)              # the sequence goes to sp
    target = jax.sharding.reshard(target, ACT)
    y = jax.shard_map(block, mesh=mesh, in_specs=(PARAM_SPECS, ACT), out_specs=ACT)(params, x)
    return jax.shard_map(loss, mesh=mesh, in_specs=(ACT, ACT), out_specs=P())(y, target)


def step(mesh, params, batch, *, block=ulysses_block, loss=mse):
    """The loss and the gradients of the parameters (same tree, same shardings)."""
    with jax.set_mesh(mesh):
        fn = functools.partial(loss_fn, mesh=mesh, block=block, loss=loss)
        return jax.jit(jax.value_and_grad(fn))(params, batch)


def reference(params, batch):
    """The same model on one device."""
    def loss(params):
        x, target = batch
        q, k, v = project(params, x)
        y = jnp.einsum("bshk,hkd->bsd", causal_attention(q, k, v), params["attn"]["wo"])
        return jnp.mean((x + y - target) ** 2)

    return jax.value_and_grad(loss)(params)


def entry_kwargs(block):
    return {"block": block}
