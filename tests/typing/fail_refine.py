# legs: plugin
# ruff: noqa: B018, F722, F821, F841  (expressions evaluated for their static errors; jaxtyping dims)
"""The bug classes the Shard / Partial refinement catches statically (DESIGN.md §1b): JAX
types every one of these Varying and computes wrong numbers."""

import jax
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import Invariant, Unreduced, Varying


def row_parallel_bias(h: st.Float[Varying["dp", "tp"], "b f/tp"], w2: st.Float[Varying["tp"], "f/tp d"],
                      b: Invariant) -> Varying["dp"]:
    y = h @ w2 + b  # E: spmd-partial-plus-replicated
    h @ w2 + 0.5 * b  # E: spmd-partial-plus-replicated
    h @ w2 + (0.0 * b + 1.0)  # E: spmd-partial-plus-replicated
    h @ w2 + 2.0 / (0.0 * b)  # E: spmd-partial-plus-replicated
    return st.psum(h @ w2 - 1.0, "tp")  # E: spmd-partial-plus-replicated


def bias_plain_spelling(h: st.Shard["tp", -1], w2: st.Shard["tp", -2], b: st.Rep["tp"]) -> None:
    h @ w2 + b  # E: spmd-partial-plus-replicated
    st.numpy.concatenate([h @ w2, b])  # E: spmd-partial-plus-replicated


def normaliser_over_shard(loss: st.Float[Varying["tp"], "s/tp"], mask: st.Float[Varying["tp"], "s/tp"]
                          ) -> None:
    st.psum(loss.sum(), "tp") / mask.sum()  # E: spmd-partial-divisor
    total = st.psum((loss * mask).sum(), "tp")
    total / st.numpy.sum(mask)  # E: spmd-partial-divisor


def nonlinear_on_partial(h: st.Shard["tp", -1], w2: st.Shard["tp", -2], p: st.Partial["tp"]) -> None:
    st.nn.gelu(h @ w2)  # E: spmd-partial-nonlinear
    st.numpy.exp(p)  # E: spmd-partial-nonlinear
    p * p  # E: spmd-partial-nonlinear
    p.max()  # E: spmd-partial-nonlinear
    abs(p)  # E: spmd-partial-nonlinear
    p @ p  # E: spmd-partial-nonlinear


def psum_of_shard(g: st.Float[Varying["ep"], "e/ep d f"], x: st.Shard["dp", -1]) -> None:
    st.psum(g, "ep")  # E: spmd-shard-reduce
    st.pmean(x, "dp")  # E: spmd-shard-reduce
    st.psum(st.nn.relu(x) * 2.0, "dp")  # E: spmd-shard-reduce


def where_on_partial(p: st.Partial["tp"], x: Varying["tp"], c: Invariant) -> None:
    st.numpy.where(x > 0.0, p, 0.0)  # E: spmd-partial-select
    st.numpy.where(c > 0.0, p, 0.0)  # a uniform predicate: masking a partial sum is linear


def replicated_update_with_partial_grad(w: st.Rep["tp"], x: st.Shard["tp", -1]) -> None:
    def loss(w: st.Rep["tp"], x: st.Shard["tp", -1]) -> Varying["tp"]:
        return (w * x).sum()
    g = st.grad(loss)(w, x)
    w - 0.1 * g  # E: spmd-partial-plus-replicated


def bad_hints(x: st.Shard["tp"], y: st.Partial["tp", -1]) -> None: ...  # E: spmd-bad-hint E: spmd-bad-hint


def takes_shard(x: st.Shard["tp", -1]) -> None: ...
def takes_partial(p: st.Partial["tp"]) -> None: ...


def hint_mismatch(c: Invariant, s: st.Shard["tp", -1], p: st.Partial["tp"], v: Varying["tp"]) -> None:
    takes_shard(c)  # E: arg-type
    takes_shard(p)  # E: arg-type
    takes_partial(s)  # E: arg-type
    takes_partial(v)  # a plain Varying value: the dims are gradual
    takes_shard(s)


def softmax_over_shard(logits: st.Float[Varying["tp"], "b v/tp"], h: st.Float[Varying["tp"], "b h/tp t"]
                       ) -> None:
    st.nn.softmax(logits)  # E: spmd-partial-nonlinear
    st.nn.log_softmax(logits, axis=-1)  # E: spmd-partial-nonlinear
    st.nn.softmax(h, axis=-1)  # over t: not the sharded dim


# in_specs literals refine plain Varying parameters (`refine_shape.from_spec`, as the runtime)
@st.shard_map(mesh=None, in_specs=(P("dp", None), P(None, "tp"), P("tp", None), P()), out_specs=P("dp"))
def mlp_from_specs(x: st.Float[Varying["dp"], "b d"], w1: st.Float[Varying["tp"], "d f"],
                   w2: st.Float[Varying["tp"], "f d"], b2: Invariant) -> Varying["dp"]:
    h = st.nn.gelu(x @ w1)
    return st.psum(h @ w2 + b2, "tp")  # E: spmd-partial-plus-replicated


@st.shard_map(mesh=None, in_specs=P("tp"), out_specs=P())
def softmax_from_specs(logits: st.Float[Varying["tp"], "v"]) -> Invariant:
    return st.psum(st.nn.softmax(logits).sum(), "tp")  # E: spmd-partial-nonlinear


# a state mismatch at a return is the out-boundary rule (SPMD401), not mypy's return-value
def returns_unreduced(u: Unreduced["tp"]) -> Invariant:
    return u  # E: spmd-out-spec-state


def returns_partial(h: st.Shard["tp", -1], w2: st.Shard["tp", -2]) -> Invariant:
    return h @ w2  # E: spmd-out-spec-state


def returns_tuple(u: Unreduced["tp"], x: Varying["tp"]) -> tuple[Invariant, Varying["tp"]]:
    return u, x  # E: spmd-out-spec-state


# per-example gradients of a replicated parameter under jax.vmap (SPMD407, jax#36886)
def _per_example_loss(p: Varying["dp"], x: Varying["dp"]) -> Varying["dp"]:
    return st.numpy.sin(st.numpy.dot(p, x))


def per_example_grads(params: Invariant, xs: Varying["dp"]) -> None:
    jax.vmap(st.grad(_per_example_loss), in_axes=(None, 0))(params, xs)  # E: spmd-vmap-grad-invariant
    jax.vmap(st.grad(_per_example_loss, argnums=(0, 1)), in_axes=(None, 0))(params, xs)  # E: spmd-vmap-grad-invariant
    jax.vmap(st.grad(_per_example_loss, argnums=1), in_axes=(None, 0))(params, xs)  # xs varies: no sum
    jax.vmap(st.grad(_per_example_loss), in_axes=(None, 0))(st.pcast(params, "dp", to="varying"), xs)
    jax.vmap(st.grad(_per_example_loss), in_axes=(None, 0))(params, params)  # nothing varies


def bias_not_pre_divided(h: st.Shard["tp", -1], w2: st.Shard["tp", -2], b: Invariant,
                         p: st.Partial["dp", "tp"]) -> None:
    n = st.axis_size("tp")
    h @ w2 + b  # E: spmd-partial-plus-replicated
    h @ w2 + b / 4  # E: spmd-partial-plus-replicated
    h @ w2 + b / st.axis_size("dp")  # E: spmd-partial-plus-replicated
    h @ w2 + (b / n) * 2  # E: spmd-partial-plus-replicated
    h @ w2 + b * (2 / n)  # E: spmd-partial-plus-replicated
    p + b / n  # E: spmd-partial-plus-replicated


# a replicated value sliced to the local extent of a sharded dim and laid along that dim
# (SPMD215): the attention sinks of the local heads taken as the first heads of the table
def sinks_of_the_first_heads(q: st.Float[Varying["dp", "tp"], "b/dp h/tp t d"],
                             sinks: st.Float[Invariant, "h"], pos: st.Float[Invariant, "t d"]) -> None:
    b, h, t, d = q.shape
    s = st.numpy.einsum("bhqd,bhkd->bhqk", q, q) / st.numpy.sqrt(float(d))
    st.numpy.concatenate([s, st.numpy.broadcast_to(sinks[:h, None, None], (b, h, t, 1))], -1)  # E: spmd-replicated-along-shard
    s + sinks[:h, None, None]  # E: spmd-replicated-along-shard
    heads = q.shape[1]
    s * sinks[0:heads][:, None, None]  # E: spmd-replicated-along-shard
    q + st.numpy.broadcast_to(sinks[None, :h, None, None], [b, h, t, d])  # E: spmd-replicated-along-shard


def positions_of_the_first_shard(x: st.Float[Varying["sp"], "b s/sp d"], pos: st.Float[Invariant, "n d"]
                                 ) -> None:
    s = x.shape[-2]
    x + pos[:s]  # E: spmd-replicated-along-shard
    x + pos[:s, :]  # E: spmd-replicated-along-shard
