"""FSDP x expert parallelism on a 2 x 2 x 2 mesh (data x fsdp x expert), as production code
writes it: the tokens are sharded over all three axes; the dense weights over fsdp and expert
together (gathered over both), the expert weights one expert per `expert` device and sharded
over fsdp (gathered over fsdp); an expert group's tokens are gathered over `expert`, each
device applies its expert with its gate, and `psum_scatter` over `expert` returns each token's
mixture to its device. The gradient is computed in one shard_map, against the gathered
weights behind `jax.lax.optimization_barrier` (per-device partial gradients, stacked), and
reduced in another: reduce-scattered over fsdp (and expert) and all-reduced over data.
`check_vma=True` throughout."""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

AXES = (("data", 2), ("fsdp", 2), ("expert", 2))
ALL = ("data", "fsdp", "expert")
T, D, F, E = 32, 16, 32, 2  # tokens, model, hidden, experts (one per expert device)

TOKENS = P(ALL)
PARAM_SPECS = {"dense": {"w_in": P(("fsdp", "expert"), None)},
               "router": {"w": P()},
               "experts": {"w_out": P("expert", "fsdp", None)}}
#: one partial gradient per device, stacked on a leading dimension
STACKED = jax.tree.map(lambda _: P(ALL), PARAM_SPECS)


def make_mesh():
    return jax.make_mesh((2, 2, 2), ALL, axis_types=(jax.sharding.AxisType.Explicit,) * 3)


def make_params(key):
    k = jax.random.split(key, 3)
    return {"dense": {"w_in": jax.random.normal(k[0], (D, F)) / jnp.sqrt(D)},
            "router": {"w": jax.random.normal(k[1], (D, E))},
            "experts": {"w_out": jax.random.normal(k[2], (E, F, D)) / jnp.sqrt(F)}}


def make_batch(key):
    kx, kt = jax.random.split(key)
    return jax.random.normal(kx, (T, D)), jax.random.normal(kt, (T, D))


def moe_loss(full, x, target):
    # full: the gathered weights; x, target: this device's tokens [t, D]
    h = jax.nn.gelu(x @ full["dense"]["w_in"])                      # [t, F]
    gate = jax.nn.softmax(x @ full["router"]["w"], axis=-1)          # [t, E]
    hs = jax.lax.all_gather(h, "expert", tiled=True)                 # the group's tokens
    gs = jax.lax.all_gather(gate, "expert", tiled=True)
    e = jax.lax.axis_index("expert")
    mine = jax.lax.dynamic_index_in_dim(gs, e, axis=1, keepdims=False)
    contrib = (hs @ full["experts"]["w_out"][0]) * mine[:, None]    # this expert's share
    y = x + jax.lax.psum_scatter(contrib, "expert", scatter_dimension=0, tiled=True)
    return jnp.sum((y - target) ** 2) / (T * D)


def gathered(params):
    w_in = jax.lax.all_gather(params["dense"]["w_in"], ("fsdp", "expert"), axis=0, tiled=True)
    w_out = jax.lax.all_gather(params["experts"]["w_out"], "fsdp", axis=1, tiled=True)
    # per-device partial gradients: every weight varies over every axis inside the step
    return {"dense": {"w_in": jax.lax.pcast(w_in, "data", to="varying")},
            "router": {"w": jax.lax.pcast(params["router"]["w"], ALL, to="varying")},
            "experts": {"w_out": jax.lax.pcast(w_out, "data", to="varying")}}


def grad_step(params, x, target):
    full = jax.lax.optimization_barrier(gathered(params))
    loss, grads = jax.value_and_grad(moe_loss)(full, x, target)
    return jax.lax.psum(loss, ALL), jax.tree.map(lambda g: g[None], grads)


def reduce_grads(stacked):
    g = jax.tree.map(lambda s: s[0], stacked)
    w_in = jax.lax.psum_scatter(g["dense"]["w_in"], ("fsdp", "expert"), scatter_dimension=0,
                                tiled=True)
    w_out = jax.lax.psum_scatter(g["experts"]["w_out"], "fsdp", scatter_dimension=1, tiled=True)
    return {"dense": {"w_in": jax.lax.psum(w_in, "data")},
            "router": {"w": jax.lax.psum(g["router"]["w"], ALL)},
            "experts": {"w_out": jax.lax.psum(w_out, "data")}}


# ------------------------------------------------------------------ seeded one-line bugs


def grad_step_local_loss(params, x, target):  # REJECTED: SPMD401 (JAX: at the body)
    full = jax.lax.optimization_barrier(gathered(params))
    loss, grads = jax.value_and_grad(moe_loss)(full, x, target)
    return loss, jax.tree.map(lambda g: g[None], grads)  # BUG: the loss is not summed


def reduce_grads_psum_after_scatter(stacked):
    g = jax.tree.map(lambda s: s[0], stacked)
    w_in = jax.lax.psum_scatter(g["dense"]["w_in"], ("fsdp", "expert"), scatter_dimension=0,
                                tiled=True)
    w_out = jax.lax.psum_scatter(g["experts"]["w_out"], "fsdp", scatter_dimension=1, tiled=True)
    return {"dense": {"w_in": jax.lax.psum(w_in, "data")},
            "router": {"w": jax.lax.psum(g["router"]["w"], ALL)},
            "experts": {"w_out": jax.lax.psum(w_out, ("data", "fsdp"))}}  # BUG: SPMD108


def moe_loss_residual_in_accumulator(full, x, target):
    h = jax.nn.gelu(x @ full["dense"]["w_in"])
    gate = jax.nn.softmax(x @ full["router"]["w"], axis=-1)
    hs = jax.lax.all_gather(h, "expert", tiled=True)
    gs = jax.lax.all_gather(gate, "expert", tiled=True)
    e = jax.lax.axis_index("expert")
    mine = jax.lax.dynamic_index_in_dim(gs, e, axis=1, keepdims=False)
    xs = jax.lax.all_gather(x, "expert", tiled=True)
    contrib = xs + (hs @ full["experts"]["w_out"][0]) * mine[:, None]  # BUG: SPMD210
    y = jax.lax.psum_scatter(contrib, "expert", scatter_dimension=0, tiled=True)
    return jnp.sum((y - target) ** 2) / (T * D)


def grad_step_residual_in_accumulator(params, x, target):
    full = jax.lax.optimization_barrier(gathered(params))
    loss, grads = jax.value_and_grad(moe_loss_residual_in_accumulator)(full, x, target)
    return jax.lax.psum(loss, ALL), jax.tree.map(lambda g: g[None], grads)


#: bug -> (the stage it replaces, the buggy body); `MARKED_IN` names the function holding the
#: bug's line when the body only calls it
BUGS = {"local_loss": ("grad", "grad_step_local_loss"),
        "psum_after_scatter": ("reduce", "reduce_grads_psum_after_scatter"),
        "residual_in_accumulator": ("grad", "grad_step_residual_in_accumulator")}
MARKED_IN = {"grad_step_residual_in_accumulator": "moe_loss_residual_in_accumulator"}
SHARD_MAPS = 2  # per step
ENTRIES = ("grad_step",)


def entry_kwargs(grad):
    return {"grad": grad}


# ------------------------------------------------------------------ the program


def place(mesh, params, batch):
    params = jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(mesh, s)), params,
                          PARAM_SPECS)
    return params, tuple(jax.device_put(a, NamedSharding(mesh, P("data"))) for a in batch)


def train_grads(params, batch, mesh, grad, reduce):
    x, target = (jax.sharding.reshard(a, TOKENS) for a in batch)
    loss, stacked = jax.shard_map(grad, mesh=mesh, in_specs=(PARAM_SPECS, TOKENS, TOKENS),
                                  out_specs=(P(), STACKED))(params, x, target)
    grads = jax.shard_map(reduce, mesh=mesh, in_specs=(STACKED,),
                          out_specs=PARAM_SPECS)(stacked)
    return loss, grads


def step(mesh, params, batch, *, grad=grad_step, reduce=reduce_grads):
    """The loss and the gradients (sharded as the parameters)."""
    with jax.set_mesh(mesh):
        fn = functools.partial(train_grads, mesh=mesh, grad=grad, reduce=reduce)
        return jax.jit(fn)(params, batch)


def reference(params, batch):
    """The same model on one device."""
    def loss(params):
        x, target = batch
        h = jax.nn.gelu(x @ params["dense"]["w_in"])
        gate = jax.nn.softmax(x @ params["router"]["w"], axis=-1)
        y = x + jnp.einsum("te,tf,efd->td", gate, h, params["experts"]["w_out"])
        return jnp.mean((y - target) ** 2)

    return jax.value_and_grad(loss)(params)
