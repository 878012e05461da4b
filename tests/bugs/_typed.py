"""Typed ports of the bug programs: the same computation written with spmdtyped (st.shard_map
bodies, typed operators, `st.numpy`/`st.nn`, typed collectives, hints that name dims).

For each class `NAME` of `bugs.BUG_CLASSES` that the runtime refinement catches, `PORTS[NAME]`
holds the typed buggy body, the typed fixed body and the code the buggy one must raise. The
line of the buggy body where it must fire ends in `# BUG(NAME)` (`bug_line(NAME)`). The specs,
the mesh, the inputs and the single-device reference are the raw module's (`bugs.NAME`).

Every body is checked by beartype against its hints, as a user's would be: `st.Shard["tp", 0]`
accepts the in_spec's shard, `st.Invariant` a replicated input.
"""

import dataclasses
import inspect
from collections.abc import Callable

import jax
from beartype import beartype

import spmdtyped as st
from spmdtyped import Invariant, Shard, Typed

snp = st.numpy


@dataclasses.dataclass(frozen=True)
class Port:
    buggy: Callable
    fixed: Callable
    code: str


PORTS: dict[str, Port] = {}


def bug_line(name: str) -> tuple[str, int]:
    """`(file, line)` of the `# BUG(name)` line of this module."""
    path = inspect.getsourcefile(bug_line)
    assert path is not None
    lines = [i for i, text in enumerate(open(path).read().splitlines(), 1)
             if text.rstrip().endswith(f"# BUG({name})")]
    assert len(lines) == 1, (name, lines)
    return path, lines[0]


# ---------------------------------------------------------------------- 1. row_parallel_bias


@beartype
def row_parallel_bias_buggy(x: Shard["dp", 0], w1: Shard["tp", 1], b1: Shard["tp", 0],
                            w2: Shard["tp", 0], b2: Invariant):
    h = st.nn.gelu(x @ w1 + b1)
    y = h @ w2 + b2  # BUG(row_parallel_bias)
    return st.psum(y, "tp")


@beartype
def row_parallel_bias_fixed(x: Shard["dp", 0], w1: Shard["tp", 1], b1: Shard["tp", 0],
                            w2: Shard["tp", 0], b2: Invariant):
    h = st.nn.gelu(x @ w1 + b1)
    return st.psum(h @ w2, "tp") + b2


PORTS["row_parallel_bias"] = Port(row_parallel_bias_buggy, row_parallel_bias_fixed, "SPMD210")

# ---------------------------------------------------------------------- 2. token_count_normaliser

DP_TP = Typed[Shard["dp", 0], Shard["tp", 1]]


@beartype
def token_count_normaliser_buggy(tok_loss: DP_TP, mask: DP_TP):
    return st.psum(snp.sum(tok_loss * mask, axis=-1) / snp.sum(mask, axis=-1), "tp")  # BUG(token_count_normaliser)


@beartype
def token_count_normaliser_fixed(tok_loss: DP_TP, mask: DP_TP):
    num = st.psum(snp.sum(tok_loss * mask, axis=-1), "tp")
    den = st.psum(snp.sum(mask, axis=-1), "tp")
    return num / den


PORTS["token_count_normaliser"] = Port(token_count_normaliser_buggy, token_count_normaliser_fixed,
                                       "SPMD212")

# ---------------------------------------------------------------------- 3. mean_of_means


@beartype
def mean_of_means_buggy(tok_loss: Shard["dp", 0], mask: Shard["dp", 0]):
    return st.pmean(snp.sum(tok_loss * mask) / snp.sum(mask), "dp")  # BUG(mean_of_means)


@beartype
def mean_of_means_fixed(tok_loss: Shard["dp", 0], mask: Shard["dp", 0]):
    return st.psum(snp.sum(tok_loss * mask), "dp") / st.psum(snp.sum(mask), "dp")


PORTS["mean_of_means"] = Port(mean_of_means_buggy, mean_of_means_fixed, "SPMD212")

# ---------------------------------------------------------------------- 4. attention_sink_heads

QKV = Typed[Shard["dp", 0], Shard["tp", 1]]


def _attend(s, sink_col, v):
    p = st.nn.softmax(snp.concatenate([s, sink_col], axis=-1), axis=-1)[..., :-1]
    return snp.einsum("bhqk,bhkd->bhqd", p, v)


@beartype
def attention_sink_heads_buggy(q: QKV, k: QKV, v: QKV, sinks: Invariant):
    b, h, t, d = q.shape
    s = snp.einsum("bhqd,bhkd->bhqk", q, k) / snp.sqrt(float(d))
    logits = snp.concatenate([s, snp.broadcast_to(sinks[:h, None, None], (b, h, t, 1))], -1)  # BUG(attention_sink_heads)
    p = st.nn.softmax(logits, axis=-1)[..., :-1]
    return snp.einsum("bhqk,bhkd->bhqd", p, v)


@beartype
def attention_sink_heads_fixed(q: QKV, k: QKV, v: QKV, sinks: Invariant):
    b, h, t, d = q.shape
    s = snp.einsum("bhqd,bhkd->bhqk", q, k) / snp.sqrt(float(d))
    # this device's heads: the sink of head i lives on the device that holds head i
    local = snp.take(sinks, st.axis_index("tp") * h + snp.arange(h))
    return _attend(s, snp.broadcast_to(local[:, None, None], (b, h, t, 1)), v)


PORTS["attention_sink_heads"] = Port(attention_sink_heads_buggy, attention_sink_heads_fixed,
                                     "SPMD215")

# ---------------------------------------------------------------------- 5. grad_norm_overcount


@beartype
def grad_norm_overcount_buggy(g_w: Shard["tp", 0], g_ln: Invariant):
    sq = snp.sum(g_w * g_w) + snp.sum(g_ln * g_ln)  # BUG(grad_norm_overcount)
    return snp.sqrt(st.psum(sq, "tp"))


@beartype
def grad_norm_overcount_fixed(g_w: Shard["tp", 0], g_ln: Invariant):
    sq = st.psum(snp.sum(g_w * g_w), "tp") + snp.sum(g_ln * g_ln)
    return snp.sqrt(sq)


PORTS["grad_norm_overcount"] = Port(grad_norm_overcount_buggy, grad_norm_overcount_fixed, "SPMD210")

# ---------------------------------------------------------------------- 6. grad_clip_local_norm

MAX_NORM = 1.0


@beartype
def grad_clip_local_norm_buggy(g1: Shard["tp", 1], g2: Shard["tp", 0]):
    norm = snp.sqrt(snp.sum(g1 * g1) + snp.sum(g2 * g2))  # BUG(grad_clip_local_norm)
    scale = snp.minimum(1.0, MAX_NORM / (norm + 1e-6))
    return g1 * scale, g2 * scale


@beartype
def grad_clip_local_norm_fixed(g1: Shard["tp", 1], g2: Shard["tp", 0]):
    norm = snp.sqrt(st.psum(snp.sum(g1 * g1) + snp.sum(g2 * g2), "tp"))
    scale = snp.minimum(1.0, MAX_NORM / (norm + 1e-6))
    return g1 * scale, g2 * scale


PORTS["grad_clip_local_norm"] = Port(grad_clip_local_norm_buggy, grad_clip_local_norm_fixed,
                                     "SPMD211")

# ---------------------------------------------------------------------- 7. expert_grads_wrong_group


def _local_expert_grad(w, x, y):
    def loss(w):
        return 0.5 * snp.sum((x[0, 0] @ w[0] - y[0, 0]) ** 2)
    # replicated over dp for the computation: the gradient is a per-device partial sum over dp
    return st.grad(loss)(st.pcast(w, "dp", to="varying"))


@beartype
def expert_grads_wrong_group_buggy(w: Shard["ep", 0], x: Typed[Shard["dp", 0], Shard["ep", 1]],
                                   y: Typed[Shard["dp", 0], Shard["ep", 1]]):
    g = _local_expert_grad(w, x, y)
    return st.psum(g, ("dp", "ep"))  # BUG(expert_grads_wrong_group)


@beartype
def expert_grads_wrong_group_fixed(w: Shard["ep", 0], x: Typed[Shard["dp", 0], Shard["ep", 1]],
                                   y: Typed[Shard["dp", 0], Shard["ep", 1]]):
    g = _local_expert_grad(w, x, y)
    return st.psum(g, "dp")


PORTS["expert_grads_wrong_group"] = Port(expert_grads_wrong_group_buggy,
                                         expert_grads_wrong_group_fixed, "SPMD108")

# ---------------------------------------------------------------------- 8. vocab_ce_missing_reduction


def _shifted_and_target_logit(logits, target):
    z = logits - st.pmax(snp.max(logits, axis=-1, keepdims=True), "tp")
    v = logits.shape[-1]                                   # this device's slice of the vocab
    local = target - st.axis_index("tp") * v
    owned = (local >= 0) & (local < v)
    picked = snp.sum(z * st.nn.one_hot(snp.minimum(snp.maximum(local, 0), v - 1), v), axis=-1)
    return z, st.psum(snp.where(owned, picked, 0.0), "tp")


@beartype
def vocab_ce_missing_reduction_buggy(logits: Typed[Shard["dp", 0], Shard["tp", 1]],
                                     target: Shard["dp", 0]):
    z, target_logit = _shifted_and_target_logit(logits, target)
    return snp.log(snp.sum(snp.exp(z), axis=-1)) - target_logit  # BUG(vocab_ce_missing_reduction)


@beartype
def vocab_ce_missing_reduction_fixed(logits: Typed[Shard["dp", 0], Shard["tp", 1]],
                                     target: Shard["dp", 0]):
    z, target_logit = _shifted_and_target_logit(logits, target)
    return snp.log(st.psum(snp.sum(snp.exp(z), axis=-1), "tp")) - target_logit


PORTS["vocab_ce_missing_reduction"] = Port(vocab_ce_missing_reduction_buggy,
                                           vocab_ce_missing_reduction_fixed, "SPMD211")

# ---------------------------------------------------------------------- 11. per_example_grads_vmap


def _net(p, x):
    return snp.sin(snp.dot(p, x))


@beartype
def per_example_grads_vmap_buggy(params: Invariant, xs: Shard["dp", 0]):
    return jax.vmap(st.grad(_net), in_axes=(None, 0))(params, xs)  # BUG(per_example_grads_vmap)


@beartype
def per_example_grads_vmap_fixed(params: Invariant, xs: Shard["dp", 0]):
    copies = st.pcast(params, "dp", to="varying")       # per-device copy: no sum over devices
    return jax.vmap(st.grad(_net), in_axes=(None, 0))(copies, xs)


PORTS["per_example_grads_vmap"] = Port(per_example_grads_vmap_buggy, per_example_grads_vmap_fixed,
                                       "SPMD407")

# ---------------------------------------------------------------------- 13. layernorm_sharded_hidden

EPS = 1e-5


@beartype
def layernorm_sharded_hidden_buggy(x: Typed[Shard["dp", 0], Shard["tp", 1]], gain: Shard["tp", 0]):
    xc = x - snp.mean(x, axis=-1, keepdims=True)  # BUG(layernorm_sharded_hidden)
    var = snp.mean(xc * xc, axis=-1, keepdims=True)
    return xc / snp.sqrt(var + EPS) * gain


@beartype
def layernorm_sharded_hidden_fixed(x: Typed[Shard["dp", 0], Shard["tp", 1]], gain: Shard["tp", 0]):
    width = x.shape[-1] * st.axis_size("tp")               # the global hidden size
    xc = x - st.psum(snp.sum(x, axis=-1, keepdims=True), "tp") / width
    var = st.psum(snp.sum(xc * xc, axis=-1, keepdims=True), "tp") / width
    return xc / snp.sqrt(var + EPS) * gain


PORTS["layernorm_sharded_hidden"] = Port(layernorm_sharded_hidden_buggy,
                                         layernorm_sharded_hidden_fixed, "SPMD210")

# ---------------------------------------------------------------------- 14. softmax_vocab_sharded


@beartype
def softmax_vocab_sharded_buggy(logits: Typed[Shard["dp", 0], Shard["tp", 1]]):
    return st.nn.softmax(logits, axis=-1)  # BUG(softmax_vocab_sharded)


@beartype
def softmax_vocab_sharded_fixed(logits: Typed[Shard["dp", 0], Shard["tp", 1]]):
    e = snp.exp(logits - st.pmax(snp.max(logits, axis=-1, keepdims=True), "tp"))
    return e / st.psum(snp.sum(e, axis=-1, keepdims=True), "tp")


PORTS["softmax_vocab_sharded"] = Port(softmax_vocab_sharded_buggy, softmax_vocab_sharded_fixed,
                                      "SPMD211")


# ---------------------------------------------------------------------- correct programs
# The false-positive risks of docs/design/shard_partial.md §4 (`bugs._correct_programs`),
# typed: name -> (typed body, what the runtime says: None = accepted as written).
# vmap_grad_sum (F6) is the autodiff part's (SPMD407, kept with its fix).


@beartype
def bias_prescaled(h: Typed[Shard["dp", 0], Shard["tp", 1]], w2: Shard["tp", 0], b: Invariant):
    # b / st.axis_size("tp") is a share of the partial sums: the psum counts it once
    return st.psum(h @ w2 + b / st.axis_size("tp"), "tp")


@beartype
def split_kv_decode(q: Invariant, k: Shard["tp", 0], v: Shard["tp", 0]):
    s = q @ k.T                                      # keys Shard(tp, -1)
    m = snp.max(s, axis=-1, keepdims=True)           # local max: plain
    p = snp.exp(s - m)                               # Shard minus extent 1: still the Shard
    den, o = snp.sum(p, axis=-1, keepdims=True), p @ v   # Partial, Partial
    alpha = snp.exp(m - st.pmax(m, "tp"))            # per-device factor: plain
    return st.psum(o * alpha, "tp") / st.psum(den * alpha, "tp")   # Partial x plain: plain


@beartype
def block_preconditioner(g: Shard["tp", 0]):
    gram = st.local(g.T @ g, "tp") + 1e-3 * snp.eye(g.shape[1])   # this shard's block, on purpose
    w, u = (st.wrap(a) for a in jax.numpy.linalg.eigh(gram.raw))
    return g @ (u * w ** -0.25) @ u.T


@beartype
def max_shard_norm(g: Shard["tp", 0]):
    return st.pmax(snp.sqrt(st.local(snp.sum(g * g), "tp")), "tp")


@beartype
def stacked_total(stacked: Shard["dp", 0]):
    return st.psum(stacked[0], "dp")                 # a constant index drops the Shard


CORRECT: dict[str, tuple[Callable, str | None]] = {
    "bias_prescaled": (bias_prescaled, None),
    "split_kv_decode": (split_kv_decode, None),
    "block_preconditioner": (block_preconditioner, None),
    "max_shard_norm": (max_shard_norm, None),
    "stacked_partials": (stacked_total, None),
}
