# ruff: noqa: F722, F821  (jaxtyping dims strings)
"""Static ports of the bug programs: the bodies of `bugs._typed` with hints the mypy plugin reads
(jaxtyping dims `st.Float[Varying["tp"], "b d/tp"]`, or `st.Shard["tp", -1]` counted from the
right), buggy and fixed. `tests/test_bug_suite_static.py` runs mypy with the plugin over this
module: every `*_fixed` function must check clean, and the line ending in `# BUG(<class>)` must
carry the `spmd-*` code that `STATIC[<class>]` names. The classes out of static reach are
listed, with the reason, in that test. Never executed: mypy reads it, pytest does not collect it.
"""

import jax

import spmdtyped as st
from spmdtyped import Invariant, Varying

snp = st.numpy

# ---------------------------------------------------------------------- 1. row_parallel_bias


def row_parallel_bias_buggy(x: st.Float[Varying["dp"], "b/dp d"], w1: st.Float[Varying["tp"], "d f/tp"],
                            b1: st.Float[Varying["tp"], "f/tp"], w2: st.Float[Varying["tp"], "f/tp d"],
                            b2: Invariant) -> Varying["dp"]:
    h = st.nn.gelu(x @ w1 + b1)
    y = h @ w2 + b2  # BUG(row_parallel_bias)
    return st.psum(y, "tp")


def row_parallel_bias_fixed(x: st.Float[Varying["dp"], "b/dp d"], w1: st.Float[Varying["tp"], "d f/tp"],
                            b1: st.Float[Varying["tp"], "f/tp"], w2: st.Float[Varying["tp"], "f/tp d"],
                            b2: Invariant) -> Varying["dp"]:
    h = st.nn.gelu(x @ w1 + b1)
    return st.psum(h @ w2, "tp") + b2


def row_parallel_bias_fixed_prescaled(x: st.Float[Varying["dp"], "b/dp d"],
                                      w1: st.Float[Varying["tp"], "d f/tp"],
                                      b1: st.Float[Varying["tp"], "f/tp"],
                                      w2: st.Float[Varying["tp"], "f/tp d"],
                                      b2: Invariant) -> Varying["dp"]:
    # FastDeploy's form: the bias divided by the tp size is this device's share of the sum
    h = st.nn.gelu(x @ w1 + b1)
    return st.psum(h @ w2 + b2 / st.axis_size("tp"), "tp")

# ---------------------------------------------------------------------- 2. token_count_normaliser


def token_count_normaliser_buggy(tok_loss: st.Float[Varying["dp", "tp"], "b/dp s/tp"],
                                 mask: st.Float[Varying["dp", "tp"], "b/dp s/tp"]) -> Varying["dp"]:
    return st.psum(snp.sum(tok_loss * mask, axis=-1) / snp.sum(mask, axis=-1), "tp")  # BUG(token_count_normaliser)


def token_count_normaliser_fixed(tok_loss: st.Float[Varying["dp", "tp"], "b/dp s/tp"],
                                 mask: st.Float[Varying["dp", "tp"], "b/dp s/tp"]) -> Varying["dp"]:
    num = st.psum(snp.sum(tok_loss * mask, axis=-1), "tp")
    den = st.psum(snp.sum(mask, axis=-1), "tp")
    return num / den

# ---------------------------------------------------------------------- 3. mean_of_means


def mean_of_means_buggy(tok_loss: st.Float[Varying["dp"], "t/dp"],
                        mask: st.Float[Varying["dp"], "t/dp"]) -> Invariant:
    return st.pmean(snp.sum(tok_loss * mask) / snp.sum(mask), "dp")  # BUG(mean_of_means)


def mean_of_means_fixed(tok_loss: st.Float[Varying["dp"], "t/dp"],
                        mask: st.Float[Varying["dp"], "t/dp"]) -> Invariant:
    return st.psum(snp.sum(tok_loss * mask), "dp") / st.psum(snp.sum(mask), "dp")

# ---------------------------------------------------------------------- 4. attention_sink_heads


def attention_sink_heads_buggy(q: st.Float[Varying["dp", "tp"], "b/dp h/tp t d"],
                               k: st.Float[Varying["dp", "tp"], "b/dp h/tp t d"],
                               v: st.Float[Varying["dp", "tp"], "b/dp h/tp t d"],
                               sinks: st.Float[Invariant, "h"]) -> Varying["dp", "tp"]:
    b, h, t, d = q.shape
    s = snp.einsum("bhqd,bhkd->bhqk", q, k) / snp.sqrt(float(d))
    logits = snp.concatenate([s, snp.broadcast_to(sinks[:h, None, None], (b, h, t, 1))], -1)  # BUG(attention_sink_heads)
    p = st.nn.softmax(logits, axis=-1)[..., :-1]
    return snp.einsum("bhqk,bhkd->bhqd", p, v)


def attention_sink_heads_fixed(q: st.Float[Varying["dp", "tp"], "b/dp h/tp t d"],
                               k: st.Float[Varying["dp", "tp"], "b/dp h/tp t d"],
                               v: st.Float[Varying["dp", "tp"], "b/dp h/tp t d"],
                               sinks: st.Float[Invariant, "h"]) -> Varying["dp", "tp"]:
    b, h, t, d = q.shape
    s = snp.einsum("bhqd,bhkd->bhqk", q, k) / snp.sqrt(float(d))
    local = snp.take(sinks, st.axis_index("tp") * h + snp.arange(h))
    logits = snp.concatenate([s, snp.broadcast_to(local[:, None, None], (b, h, t, 1))], -1)
    p = st.nn.softmax(logits, axis=-1)[..., :-1]
    return snp.einsum("bhqk,bhkd->bhqd", p, v)

# ---------------------------------------------------------------------- 5. grad_norm_overcount


def grad_norm_overcount_buggy(g_w: st.Float[Varying["tp"], "r/tp c"], g_ln: Invariant) -> Invariant:
    sq = snp.sum(g_w * g_w) + snp.sum(g_ln * g_ln)  # BUG(grad_norm_overcount)
    return snp.sqrt(st.psum(sq, "tp"))


def grad_norm_overcount_fixed(g_w: st.Float[Varying["tp"], "r/tp c"], g_ln: Invariant) -> Invariant:
    sq = st.psum(snp.sum(g_w * g_w), "tp") + snp.sum(g_ln * g_ln)
    return snp.sqrt(sq)

# ---------------------------------------------------------------------- 6. grad_clip_local_norm

MAX_NORM = 1.0


def grad_clip_local_norm_buggy(g1: st.Float[Varying["tp"], "a b/tp"], g2: st.Float[Varying["tp"], "b/tp c"]
                               ) -> tuple[Varying["tp"], Varying["tp"]]:
    norm = snp.sqrt(snp.sum(g1 * g1) + snp.sum(g2 * g2))  # BUG(grad_clip_local_norm)
    scale = snp.minimum(1.0, MAX_NORM / (norm + 1e-6))
    return g1 * scale, g2 * scale


def grad_clip_local_norm_fixed(g1: st.Float[Varying["tp"], "a b/tp"], g2: st.Float[Varying["tp"], "b/tp c"]
                               ) -> tuple[Varying["tp"], Varying["tp"]]:
    norm = snp.sqrt(st.psum(snp.sum(g1 * g1) + snp.sum(g2 * g2), "tp"))
    scale = snp.minimum(1.0, MAX_NORM / (norm + 1e-6))
    return g1 * scale, g2 * scale

# ---------------------------------------------------------------------- 7. expert_grads_wrong_group


def expert_grads_wrong_group_buggy(g: st.Float[Varying["dp", "ep"], "e/ep d f"]) -> Varying["ep"]:
    return st.psum(g, ("dp", "ep"))  # BUG(expert_grads_wrong_group)


def expert_grads_wrong_group_fixed(g: st.Float[Varying["dp", "ep"], "e/ep d f"]) -> Varying["ep"]:
    return st.psum(g, "dp")

# ---------------------------------------------------------------------- 8. vocab_ce_missing_reduction


def _shifted(logits: st.Float[Varying["dp", "tp"], "b/dp v/tp"]) -> st.Float[Varying["dp", "tp"], "b/dp v/tp"]:
    return logits - st.pmax(snp.max(logits, axis=-1, keepdims=True), "tp")


def vocab_ce_missing_reduction_buggy(logits: st.Float[Varying["dp", "tp"], "b/dp v/tp"],
                                     target_logit: st.Float[Varying["dp"], "b/dp"]) -> Varying["dp"]:
    z = _shifted(logits)
    return snp.log(snp.sum(snp.exp(z), axis=-1)) - target_logit  # BUG(vocab_ce_missing_reduction)


def vocab_ce_missing_reduction_fixed(logits: st.Float[Varying["dp", "tp"], "b/dp v/tp"],
                                     target_logit: st.Float[Varying["dp"], "b/dp"]) -> Varying["dp"]:
    z = _shifted(logits)
    return snp.log(st.psum(snp.sum(snp.exp(z), axis=-1), "tp")) - target_logit

# ---------------------------------------------------------------------- 9. vocab_ce_doubled_reduction


def _ce(logits: st.Float[Varying["dp", "tp"], "b/dp v/tp"],
        target_logit: st.Float[Varying["dp"], "b/dp"]) -> Varying["dp"]:
    return snp.log(st.psum(snp.sum(snp.exp(_shifted(logits)), axis=-1), "tp")) - target_logit


def vocab_ce_doubled_reduction_buggy(logits: st.Float[Varying["dp", "tp"], "b/dp v/tp"],
                                     target_logit: st.Float[Varying["dp"], "b/dp"]) -> Varying["dp"]:
    return st.psum(_ce(logits, target_logit), "tp")  # BUG(vocab_ce_doubled_reduction)


def vocab_ce_doubled_reduction_fixed(logits: st.Float[Varying["dp", "tp"], "b/dp v/tp"],
                                     target_logit: st.Float[Varying["dp"], "b/dp"]) -> Varying["dp"]:
    return _ce(logits, target_logit)

# ---------------------------------------------------------------------- 11. per_example_grads_vmap


def _net(p: Varying["dp"], x: Varying["dp"]) -> Varying["dp"]:
    return snp.sin(snp.dot(p, x))


def per_example_grads_vmap_buggy(params: Invariant, xs: st.Float[Varying["dp"], "n/dp c"]) -> Varying["dp"]:
    return jax.vmap(st.grad(_net), in_axes=(None, 0))(params, xs)  # BUG(per_example_grads_vmap)


def per_example_grads_vmap_fixed(params: Invariant, xs: st.Float[Varying["dp"], "n/dp c"]) -> Varying["dp"]:
    copies = st.pcast(params, "dp", to="varying")       # per-device copy: no sum over devices
    return jax.vmap(st.grad(_net), in_axes=(None, 0))(copies, xs)

# ---------------------------------------------------------------------- 13. layernorm_sharded_hidden

EPS = 1e-5


def layernorm_sharded_hidden_buggy(x: st.Float[Varying["dp", "tp"], "b/dp h/tp"],
                                   gain: st.Float[Varying["tp"], "h/tp"]) -> Varying["dp", "tp"]:
    xc = x - snp.mean(x, axis=-1, keepdims=True)  # BUG(layernorm_sharded_hidden)
    var = snp.mean(xc * xc, axis=-1, keepdims=True)
    return xc / snp.sqrt(var + EPS) * gain


def layernorm_sharded_hidden_fixed(x: st.Float[Varying["dp", "tp"], "b/dp h/tp"],
                                   gain: st.Float[Varying["tp"], "h/tp"]) -> Varying["dp", "tp"]:
    width = x.shape[-1] * st.axis_size("tp")
    xc = x - st.psum(snp.sum(x, axis=-1, keepdims=True), "tp") / width
    var = st.psum(snp.sum(xc * xc, axis=-1, keepdims=True), "tp") / width
    return xc / snp.sqrt(var + EPS) * gain

# ---------------------------------------------------------------------- 14. softmax_vocab_sharded


def softmax_vocab_sharded_buggy(logits: st.Float[Varying["dp", "tp"], "b/dp v/tp"]) -> Varying["dp", "tp"]:
    return st.nn.softmax(logits, axis=-1)  # BUG(softmax_vocab_sharded)


def softmax_vocab_sharded_fixed(logits: st.Float[Varying["dp", "tp"], "b/dp v/tp"]) -> Varying["dp", "tp"]:
    e = snp.exp(logits - st.pmax(snp.max(logits, axis=-1, keepdims=True), "tp"))
    return e / st.psum(snp.sum(e, axis=-1, keepdims=True), "tp")
