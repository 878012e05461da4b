"""A ring expert-parallel MoE layer on a 2 x 2 x 2 mesh (data x expert x tp), written for
`check_vma=False` as MoE kernels in production often are: the tokens are sharded over data and
expert; `jax.lax.all_gather` over `expert` gives every device its group's tokens, which it
routes locally (top-1: the device's experts come from `axis_index`, the rows are sorted by
expert with `argsort`), runs through its two experts with `jax.lax.ragged_dot` (the hidden
dimension sharded over `tp`), scatter-adds back into a buffer of the group's tokens and
reduce-scatters over `expert` (then sums over tp). The embedding around it is explicit-sharding
code (`out_sharding=`, `jax.sharding.reshard`); the gradient is `jax.value_and_grad` of the
global program."""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

AXES = (("data", 2), ("expert", 2), ("tp", 2))
T, D, F, E = 32, 16, 32, 4  # tokens, model, hidden, experts (two per expert device)
E_LOCAL = E // 2

TOKENS = P(("data", "expert"))
PARAM_SPECS = {"embed": P(), "router": P(),
               "experts": {"w_up": P("expert", None, "tp"), "w_down": P("expert", "tp", None)}}
CHECK_VMA = False  # the MoE shard_map's
MOE_SPECS = {"router": P(), "experts": PARAM_SPECS["experts"]}


def make_mesh():
    return jax.make_mesh((2, 2, 2), ("data", "expert", "tp"),
                         axis_types=(jax.sharding.AxisType.Explicit,) * 3)


def make_params(key):
    k = jax.random.split(key, 4)
    return {"embed": jax.random.normal(k[0], (D, D)) / jnp.sqrt(D),
            "router": jax.random.normal(k[1], (D, E)),
            "experts": {"w_up": jax.random.normal(k[2], (E, D, F)) / jnp.sqrt(D),
                        "w_down": jax.random.normal(k[3], (E, F, D)) / jnp.sqrt(F)}}


def make_batch(key):
    kx, kt = jax.random.split(key)
    return jax.random.normal(kx, (T, D)), jax.random.normal(kt, (T, D))


def route(router, xs):
    """Top-1 routing of the group's tokens to this device's experts: the row order (by local
    expert, the other devices' rows last), the group sizes and each row's gate."""
    probs = jax.nn.softmax(xs @ router, axis=-1)
    expert = jnp.argmax(probs, axis=-1)
    gate = jnp.take_along_axis(probs, expert[:, None], axis=-1)[:, 0]
    local = expert - jax.lax.axis_index("expert") * E_LOCAL
    is_local = (local >= 0) & (local < E_LOCAL)
    key = jnp.where(is_local, local, E_LOCAL)
    order = jnp.argsort(key)
    sizes = jnp.sum(key[:, None] == jnp.arange(E_LOCAL)[None, :], axis=0).astype(jnp.int32)
    return order, sizes, jnp.where(is_local, gate, 0.0)[order]


def moe_layer(params, x):
    xs = jax.lax.all_gather(x, "expert", tiled=True)                 # [2t, D]: the group
    order, sizes, gate = route(params["router"], xs)
    w = params["experts"]
    h = jax.nn.gelu(jax.lax.ragged_dot(xs[order], w["w_up"], sizes))   # [2t, F/tp]
    y = jax.lax.ragged_dot(h, w["w_down"], sizes) * gate[:, None]    # partial over tp
    out = jnp.zeros_like(xs).at[order].add(y)
    out = jax.lax.psum_scatter(out, "expert", scatter_dimension=0, tiled=True)
    return x + jax.lax.psum(out, "tp")


# ------------------------------------------------------------------ seeded one-line bugs


def moe_layer_residual_in_buffer(params, x):
    xs = jax.lax.all_gather(x, "expert", tiled=True)
    order, sizes, gate = route(params["router"], xs)
    w = params["experts"]
    h = jax.nn.gelu(jax.lax.ragged_dot(xs[order], w["w_up"], sizes))
    y = jax.lax.ragged_dot(h, w["w_down"], sizes) * gate[:, None]
    out = xs.at[order].add(y)  # BUG: SPMD210
    out = jax.lax.psum_scatter(out, "expert", scatter_dimension=0, tiled=True)
    return jax.lax.psum(out, "tp")


def moe_layer_no_tp_sum(params, x):  # REJECTED: SPMD401 (with the checks on: at the body)
    xs = jax.lax.all_gather(x, "expert", tiled=True)
    order, sizes, gate = route(params["router"], xs)
    w = params["experts"]
    h = jax.nn.gelu(jax.lax.ragged_dot(xs[order], w["w_up"], sizes))
    y = jax.lax.ragged_dot(h, w["w_down"], sizes) * gate[:, None]
    out = jnp.zeros_like(xs).at[order].add(y)
    out = jax.lax.psum_scatter(out, "expert", scatter_dimension=0, tiled=True)
    return x + out  # BUG: the partial sums over tp are not summed


def moe_layer_slice_for_scatter(params, x):
    xs = jax.lax.all_gather(x, "expert", tiled=True)
    order, sizes, gate = route(params["router"], xs)
    w = params["experts"]
    h = jax.nn.gelu(jax.lax.ragged_dot(xs[order], w["w_up"], sizes))
    y = jax.lax.ragged_dot(h, w["w_down"], sizes) * gate[:, None]
    out = jnp.zeros_like(xs).at[order].add(y)
    start = jax.lax.axis_index("expert") * x.shape[0]
    out = jax.lax.dynamic_slice_in_dim(out, start, x.shape[0], axis=0)  # BUG: SPMD213
    return x + jax.lax.psum(out, "tp")


BUGS = {"residual_in_buffer": ("layer", "moe_layer_residual_in_buffer"),
        "no_tp_sum": ("layer", "moe_layer_no_tp_sum"),
        "slice_for_scatter": ("layer", "moe_layer_slice_for_scatter")}
SHARD_MAPS = 1  # per step: the loss is global-view code
ENTRIES = ("moe_layer",)


def entry_kwargs(layer):
    return {"layer": layer}


# ------------------------------------------------------------------ the program


def place(mesh, params, batch):
    params = jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(mesh, s)), params,
                          PARAM_SPECS)
    return params, tuple(jax.device_put(a, NamedSharding(mesh, TOKENS)) for a in batch)


def loss_fn(params, batch, mesh, layer):
    tokens, target = batch
    x = jnp.einsum("td,de->te", tokens, params["embed"], out_sharding=TOKENS)
    moe = {"router": params["router"], "experts": params["experts"]}
    y = jax.shard_map(layer, mesh=mesh, in_specs=(MOE_SPECS, TOKENS), out_specs=TOKENS,
                      check_vma=CHECK_VMA)(moe, x)
    return jnp.mean((jax.sharding.reshard(y, P()) - target) ** 2)


def step(mesh, params, batch, *, layer=moe_layer):
    with jax.set_mesh(mesh):
        fn = functools.partial(loss_fn, mesh=mesh, layer=layer)
        return jax.jit(jax.value_and_grad(fn))(params, batch)


def reference(params, batch):
    """The same layer on one device: every token through its top-1 expert."""
    def loss(params):
        tokens, target = batch
        x = tokens @ params["embed"]
        probs = jax.nn.softmax(x @ params["router"], axis=-1)
        expert = jnp.argmax(probs, axis=-1)
        gate = jnp.take_along_axis(probs, expert[:, None], axis=-1)[:, 0]
        w = params["experts"]
        h = jax.nn.gelu(jnp.einsum("td,tdf->tf", x, w["w_up"][expert]))
        y = jnp.einsum("tf,tfd->td", h, w["w_down"][expert]) * gate[:, None]
        return jnp.mean((x + y - target) ** 2)

    return jax.value_and_grad(loss)(params)
