# legs: plugin
# ruff: noqa: F722, F821  (jaxtyping dims strings)
"""Shard / Partial / Rep refinements (DESIGN.md §1b) that the plugin follows and accepts: the
correct tensor-parallel programs whose buggy versions are in fail_refine.py."""

from typing import Literal, assert_type, reveal_type

from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import Invariant, Varying
from spmdtyped._static import AxisSize  # the static type of st.axis_size


def column_row_mlp(x: st.Float[Varying["dp"], "b d"], w1: st.Float[Varying["tp"], "d f/tp"],
                   b1: st.Float[Varying["tp"], "f/tp"], w2: st.Float[Varying["tp"], "f/tp d"],
                   b2: Invariant) -> Varying["dp"]:
    h = st.nn.gelu(x @ w1 + b1)            # column parallel: Shard["tp", -1]
    reveal_type(h)  # reveals: tp=S-1
    partial = h @ w2                       # row parallel: the contracted dim is sharded
    reveal_type(partial)  # reveals: tp=P
    return st.psum(partial, "tp") + b2     # reduce, then add the bias


def row_parallel_plain_spelling(h: st.Shard["tp", -1], w2: st.Shard["tp", -2],
                                b: Invariant) -> Invariant:
    y = st.psum(h @ w2, "tp")
    return y + b


def zero_term_before_the_reduction(h: st.Float[Varying["dp", "tp"], "b f/tp"],
                                   w2: st.Float[Varying["tp"], "f/tp d"], b: Invariant) -> Varying["dp"]:
    zero = 0.0 * b                         # keeps b in the program, adds nothing
    reveal_type(zero)  # reveals: 0
    reveal_type(-zero)  # reveals: 0
    reveal_type(zero / 2.0)  # reveals: 0
    reveal_type(zero * 3.0)  # reveals: 0
    return st.psum(h @ w2 * 2.0 + zero + b * 0 - zero / 2.0 + (-zero) * 3.0, "tp")


def shard_dims_of_both_signs(left: st.Float[st.Shard["tp", Literal[0]], "f d"],
                             second: st.Float[st.Shard["tp", 1], "b f d"],
                             right: st.Shard["tp", Literal[-1]]) -> None:
    reveal_type(left)  # reveals: tp=S-2, #2
    reveal_type(second)  # reveals: tp=S-2, #3
    reveal_type(right)  # reveals: tp=S-1


def partial_algebra(p: st.Partial["tp"], q: st.Partial["tp"], r: st.Rep["tp"], c: Invariant) -> Invariant:
    s = (p + q) * 2.0 - q / c              # Partial +- Partial, x replicated, / replicated
    assert_type(s, st.Partial["tp"])
    t = p * r                              # a Rep factor keeps the partial sum
    return st.psum(s + t, "tp")


def megatron_mean(x: st.Float[Varying["dp"], "b/dp d"]) -> Invariant:
    local = x.mean()                       # a mean over the batch shard: plain Varying
    return st.psum(local, "dp") / st.axis_size("dp")


def pmean_of_local_means(x: st.Float[Varying["dp"], "b/dp d"]) -> Invariant:
    return st.pmean(x.mean(), "dp")


def global_sum(x: st.Float[Varying["dp"], "b/dp d"]) -> Invariant:
    total = x.sum()                        # summing the shard: a partial sum over dp
    reveal_type(total)  # reveals: dp=P
    return st.psum(total, "dp") / 2.0


def token_normaliser(loss: st.Float[Varying["tp"], "s/tp"], mask: st.Float[Varying["tp"], "s/tp"]
                     ) -> Invariant:
    count = st.psum(mask.sum(), "tp")      # reduce the divisor first
    return st.psum((loss * mask).sum(), "tp") / count


def attention_heads(q: st.Float[Varying["dp", "tp"], "b s h/tp k"],
                    k: st.Float[Varying["dp", "tp"], "b t h/tp k"],
                    v: st.Float[Varying["dp", "tp"], "b t h/tp k"],
                    wo: st.Float[Varying["tp"], "hk/tp d"]) -> Varying["dp"]:
    scores = st.numpy.einsum("bshk,bthk->bhst", q, k)       # heads stay sharded
    reveal_type(scores)  # reveals: tp=S-3, #4
    probs = st.nn.softmax(scores)                            # over t: not the sharded dim
    reveal_type(probs)  # reveals: tp=S-3
    out = st.numpy.einsum("bhst,bthk->bshk", probs, v)
    reveal_type(out)  # reveals: tp=S-2
    merged = out.reshape(2, 3, 4)                            # heads merged: dims unknown
    reveal_type(merged)  # reveals: plain
    return st.psum(merged @ wo, "tp")


def owner_mask(b: Invariant, h: st.Shard["tp", -1], w2: st.Shard["tp", -2]) -> Invariant:
    bias_once = st.numpy.where(st.axis_index("tp") == 0, b, 0.0)   # the owner's term: Partial
    assert_type(bias_once, st.Partial["tp"])
    return st.psum(h @ w2 + bias_once, "tp")


def reduce_scatter(h: st.Float[Varying["tp"], "n f/tp"], w2: st.Float[Varying["tp"], "f/tp d"]
                   ) -> Invariant:
    shard = st.psum_scatter(h @ w2, "tp", scatter_dimension=0, tiled=True)  # rows over tp
    reveal_type(shard)  # reveals: tp=S-2
    full = st.all_gather(shard, "tp", axis=0, tiled=True)  # every device: the whole array
    reveal_type(full)  # reveals: tp=R
    return st.pmax(full, "tp")


def gradual(v: Varying["tp"], s: st.Shard["tp", -1], p: st.Partial["tp"]) -> Varying["tp"]:
    takes_shard(v)                         # a plain Varying value fits a Shard parameter
    takes_varying(s)                       # a refined value fits a plain one
    y = s                                  # a variable may change its refinement
    y = p
    return y


def takes_shard(x: st.Shard["tp", -1]) -> None: ...
def takes_varying(x: Varying["tp"]) -> None: ...


def branches(s: st.Shard["tp", -1], p: st.Partial["tp"], flag: bool) -> Invariant:
    y = s if flag else p                   # joined: plain Varying (no refinement to check)
    return st.psum(y, "tp")


def grad_of_replicated(w: st.Rep["tp"], x: st.Shard["tp", -1]) -> Varying["tp"]:
    def loss(w: st.Rep["tp"], x: st.Shard["tp", -1]) -> Varying["tp"]:
        return (w * x).sum()
    g = st.grad(loss)(w, x)                # the cotangent of a Rep value is a partial sum
    assert_type(g, st.Partial["tp"])
    return w - 0.1 * st.psum(g, "tp")


def comparisons_keep_state(p: st.Partial["tp"], x: Varying["dp"]) -> None:
    assert_type(x == 0.0, Varying["dp"])
    assert_type(x != x, Varying["dp"])


def mixed_spellings(a: st.Typed[st.Shard["tp", -1], Varying["dp"]],
                    b: st.Float[st.Shard["tp", 0], "f d"],
                    c: st.Typed[st.Partial["tp"], st.Shard["dp", -2]],
                    d: st.Shard["tp", 0]) -> None:
    reveal_type(a)  # reveals: tp=S-1
    reveal_type(b)  # reveals: tp=S-2, #2
    reveal_type(c)  # reveals: tp=P, dp=S-2
    reveal_type(d)  # reveals: tp=S+0  (dim 0 of an unknown rank: plain Varying)
    reveal_type(a @ b)  # reveals: tp=P
    reveal_type(st.psum(c, "tp").sum(0))  # reveals: plain


QKV = st.Typed[st.Shard["dp", 0], st.Shard["tp", 1]]  # dims from the left in an alias: no valid-type error


def aliased_hint(q: QKV, logits: st.Float[Varying["tp"], "b v/tp"], x: st.Shard["tp", -1]) -> None:
    reveal_type(q)  # reveals: dp=S+0, tp=S+1
    reveal_type(st.nn.softmax(logits, axis=0))  # reveals: tp=S-1  (over another dim: the Shard kept)
    reveal_type(st.nn.softmax(x, axis=0))  # reveals: plain  (dim 0 of an unknown rank)


# in_specs literals refine plain Varying parameters; without a rank the dims stay unknown
@st.shard_map(mesh=None, in_specs=(P("dp", None), P(None, "tp"), P("tp", None), P()), out_specs=P("dp"))
def mlp_from_specs(x: st.Float[Varying["dp"], "b d"], w1: st.Float[Varying["tp"], "d f"],
                   w2: st.Float[Varying["tp"], "f d"], b2: Invariant) -> Varying["dp"]:
    h = st.nn.gelu(x @ w1)
    reveal_type(h)  # reveals: dp=S-2, tp=S-1, #2
    return st.psum(h @ w2, "tp") + b2


@st.shard_map(mesh=None, in_specs=P("dp"), out_specs=P("dp"))
def rank_unknown(x: Varying["dp"]) -> Varying["dp"]:
    reveal_type(x.sum(axis=-1))  # reveals: plain
    return st.nn.softmax(x, axis=-1)  # P("dp") on a rank-2 x shards dim -2: nothing is known


def row_parallel_bias_pre_divided(h: st.Shard["tp", -1], w2: st.Shard["tp", -2], b: Invariant,
                                  r: st.Rep["tp"], q: st.Partial["dp", "tp"]) -> None:
    n = st.axis_size("tp")                 # an int that remembers its axes
    assert_type(n, AxisSize[Literal["tp"]])
    reveal_type(b / n)  # reveals: /tp
    y = h @ w2 + b / n                     # this device's share of the bias: a Partial term
    reveal_type(y)  # reveals: tp=P
    assert_type(h @ w2 + b * (1 / n), st.Partial["tp"])
    assert_type((1 / n) * b + h @ w2, st.Partial["tp"])
    assert_type(h @ w2 - r / st.axis_size("tp"), st.Partial["tp"])
    both = st.axis_size(("dp", "tp"))
    assert_type(q + b / both, st.Partial["dp", "tp"])
    width: int = n * 2                     # still an int everywhere else
    st.psum(y, "tp") / width


def sinks_of_the_local_heads(q: st.Float[Varying["dp", "tp"], "b/dp h/tp t d"],
                             sinks: st.Float[Invariant, "h"]) -> None:
    b, h, t, d = q.shape
    s = st.numpy.einsum("bhqd,bhkd->bhqk", q, q) / st.numpy.sqrt(float(d))
    # the local heads' sinks: sliced by the device's offset (the fixed attention-sink program)
    local = st.numpy.take(sinks, st.axis_index("tp") * h + st.numpy.arange(h))
    st.numpy.concatenate([s, st.numpy.broadcast_to(local[:, None, None], (b, h, t, 1))], -1)
    # the local extent laid along an unsharded dim: nothing built for the shard
    s + sinks[:h]
    s + sinks[None, None, None, :h]
    # out of static reach (no error here), rejected by the runtime where the extent is > 1
    # (`test_plugin_refine.test_plugin_and_runtime_on_static_extents`): an unsharded dim's
    # extent, a literal extent, a name assigned twice, each laid along the heads
    s + sinks[:t, None, None]
    s + sinks[:4, None, None]
    k = h
    k = 2 * k
    s + sinks[:k, None, None]
    # the whole table, broadcast over the heads: every head gets the same row (not along them)
    s + st.numpy.broadcast_to(sinks[None, None, None, :1], (b, h, t, 1))
