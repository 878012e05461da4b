"""A small Llama-style decoder written as docs/ecosystem.md teaches: jnp / jax.nn / jax.lax
inside the modules, typed hints only at the `st.shard_map` step (tests/test_engine_llama_*.py).

Tensor parallel over "tp" (heads and the MLP's hidden dim: column-parallel in, row-parallel
out, each followed by its psum), data parallel over "dp". `TP` is the axis the modules reduce
over: None on one device (the reference), "tp" inside shard_map. `MISTAKE` selects one of the
three mistakes (each on one line, marked `# MISTAKE: <name>`):

- "bias_before_psum": the row-parallel projection's bias added before its psum (SPMD210);
- "no_psum": the psum after the row-parallel projection forgotten;
- "pmean_reduced_grads": a pmean over dp of gradients JAX already summed (SPMD103).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax
import jax.numpy as jnp

CONFIG = {"TP": None, "MISTAKE": None}
VOCAB, D, HEADS, HD, FF, LAYERS, SEQ = 32, 16, 4, 4, 32, 1, 8


def reduce_tp(h):
    return h if CONFIG["TP"] is None else jax.lax.psum(h, CONFIG["TP"])


def rms_norm(x, g):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * g


def attention(x, wq, wk, wv, wo):
    b, s, _ = x.shape
    q = (x @ wq).reshape(b, s, -1, HD)              # column-parallel: this device's heads
    k = (x @ wk).reshape(b, s, -1, HD)
    v = (x @ wv).reshape(b, s, -1, HD)
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(float(HD))
    mask = jnp.tril(jnp.ones((s, s), bool))
    p = jax.nn.softmax(jnp.where(mask, logits, -1e9), axis=-1)
    o = jnp.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, s, -1)
    return reduce_tp(o @ wo)                        # row-parallel: summed over tp


def mlp(x, w_gate, w_up, w_down, b_down):
    h = jax.nn.silu(x @ w_gate) * (x @ w_up)        # column-parallel
    if CONFIG["MISTAKE"] == "bias_before_psum":
        return reduce_tp(h @ w_down + b_down)  # MISTAKE: bias_before_psum
    if CONFIG["MISTAKE"] == "no_psum":
        return h @ w_down + b_down  # MISTAKE: no_psum
    return reduce_tp(h @ w_down) + b_down           # row-parallel, then the bias once


def block(p, x):
    x = x + attention(rms_norm(x, p["g1"]), p["wq"], p["wk"], p["wv"], p["wo"])
    return x + mlp(rms_norm(x, p["g2"]), p["w_gate"], p["w_up"], p["w_down"], p["b_down"])


def decoder(params, tokens):
    x = params["embed"][tokens]
    for p in params["blocks"]:
        x = block(p, x)
    return rms_norm(x, params["g_out"]) @ params["embed"].T


def loss_of(logits, targets):
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def block_params(key):
    k = jax.random.split(key, 7)
    n = lambda i, shape: 0.2 * jax.random.normal(k[i], shape, jnp.float32)  # noqa: E731
    return {"g1": jnp.ones(D), "g2": jnp.ones(D), "wq": n(0, (D, HEADS * HD)),
            "wk": n(1, (D, HEADS * HD)), "wv": n(2, (D, HEADS * HD)), "wo": n(3, (HEADS * HD, D)),
            "w_gate": n(4, (D, FF)), "w_up": n(5, (D, FF)), "w_down": n(6, (FF, D)),
            "b_down": 0.1 * jnp.ones(D)}


def init_params(seed=0):
    keys = jax.random.split(jax.random.key(seed), LAYERS + 1)
    return {"embed": 0.2 * jax.random.normal(keys[0], (VOCAB, D), jnp.float32),
            "blocks": [block_params(k) for k in keys[1:]], "g_out": jnp.ones(D)}


def block_specs(P):
    col, row = P(None, "tp"), P("tp", None)
    return {"g1": P(), "g2": P(), "wq": col, "wk": col, "wv": col, "wo": row,
            "w_gate": col, "w_up": col, "w_down": row, "b_down": P()}


def param_specs(P):
    return {"embed": P(), "blocks": [block_specs(P) for _ in range(LAYERS)], "g_out": P()}


def batch(seed=1, n=4):
    toks = jax.random.randint(jax.random.key(seed), (n, SEQ + 1), 0, VOCAB)
    return toks[:, :-1], toks[:, 1:]


def mistake_line(name: str) -> int:
    import inspect
    src, start = inspect.getsourcelines(mlp)
    return next(start + i for i, t in enumerate(src) if t.rstrip().endswith(f"# MISTAKE: {name}"))


def line_in(path: str, name: str) -> int:
    """The line of `path` that ends with `# MISTAKE: name` (a test file's own mistake)."""
    with open(path) as fh:
        return next(i for i, t in enumerate(fh.read().splitlines(), 1)
                    if t.rstrip().endswith(f"# MISTAKE: {name}"))


@contextlib.contextmanager
def tensor_parallel() -> Iterator[None]:
    """The decoder on the tp axis, without a mistake, for the duration of a test."""
    CONFIG.update(TP="tp", MISTAKE=None)
    try:
        yield
    finally:
        CONFIG.update(TP=None, MISTAKE=None)


def assert_mistake(run, code: str, line: int, fix: str):
    """`run()` raises the SpmdTypeError `code` at `line` whose fix names `fix`; returns it."""
    import pytest

    import spmdtyped as st
    with pytest.raises(st.SpmdTypeError) as ei:
        run()
    e = ei.value
    assert (e.code, e.line) == (code, line), str(e)
    assert fix in (e.fix or ""), e.fix
    return e
