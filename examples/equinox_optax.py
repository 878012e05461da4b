"""An equinox transformer trained with optax.adamw and st.clip_by_global_norm on a dp x tp mesh.

Megatron layout: attention heads and the MLP's hidden units are sharded over `tp`, the batch
over `dp`; everything else is replicated. The model is an ordinary `eqx.Module` written with
`jnp` and `jax.nn`; the only spmdtyped calls are the two collectives (the row-parallel `psum`
over `tp` and the loss `pmean` over `dp`), the state hints and `st.clip_by_global_norm`.
Halfway through, the model and the optimiser state are saved with
`eqx.tree_serialise_leaves` and restored into freshly sharded arrays. The loss curve and the
final parameters equal a single-device run of the same model (no shard_map) to rtol 2e-4.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # type: ignore[import-untyped]  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import spmdtyped as st  # noqa: E402
from spmdtyped import Invariant, Varying  # noqa: E402

VOCAB, D, HEADS, DH, FF, SEQ, BATCH = 64, 32, 4, 8, 64, 16, 8


def _psum_tp(y: Any, tp: str | None) -> Any:
    return st.psum(y, tp) if tp else y


class LayerNorm(eqx.Module):
    scale: jax.Array
    bias: jax.Array

    def __call__(self, x: Any) -> Any:
        mu = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + 1e-5) * self.scale + self.bias


class Block(eqx.Module):
    ln1: LayerNorm
    wqkv: jax.Array  # (D, 3, HEADS, DH): heads sharded over tp
    wo: jax.Array  # (HEADS, DH, D): row-parallel
    ln2: LayerNorm
    w1: jax.Array  # (D, FF): column-parallel
    w2: jax.Array  # (FF, D): row-parallel

    def __call__(self, x: Any, tp: str | None) -> Any:
        h = self.ln1(x)
        q, k, v = jnp.unstack(jnp.einsum("bsd,dthe->tbhse", h, self.wqkv), axis=0)
        scores = jnp.einsum("bhse,bhte->bhst", q, k) / np.sqrt(DH)
        mask = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), bool))
        att = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
        o = jnp.einsum("bhst,bhte->bhse", att, v)
        x = x + _psum_tp(jnp.einsum("bhse,hed->bsd", o, self.wo), tp)
        h = jax.nn.gelu(self.ln2(x) @ self.w1)
        return x + _psum_tp(h @ self.w2, tp)


class Transformer(eqx.Module):
    embed: jax.Array
    block: Block
    ln_f: LayerNorm
    head: jax.Array

    def __call__(self, tokens: Any, tp: str | None = None) -> Any:
        x = jnp.take(self.embed, tokens, axis=0)
        return self.ln_f(self.block(x, tp)) @ self.head


def init_model(key: jax.Array) -> Transformer:
    ks = jax.random.split(key, 6)

    def ln() -> LayerNorm:
        return LayerNorm(jnp.ones(D), jnp.zeros(D))

    def normal(k: jax.Array, shape: tuple[int, ...], fan_in: int) -> jax.Array:
        return jax.random.normal(k, shape) / np.sqrt(fan_in)

    block = Block(ln(), normal(ks[1], (D, 3, HEADS, DH), D), normal(ks[2], (HEADS, DH, D), D),
                  ln(), normal(ks[3], (D, FF), D), normal(ks[4], (FF, D), FF))
    return Transformer(normal(ks[0], (VOCAB, D), 1), block, ln(), normal(ks[5], (D, VOCAB), D))


def model_specs() -> Transformer:
    """The PartitionSpec of every parameter, as a tree of the model's structure: where the
    model is placed; `st.shard_map` reads the specs back from the arrays."""
    rep = LayerNorm(P(), P())  # type: ignore[arg-type]
    block = Block(rep, P(None, None, "tp"), P("tp"), rep, P(None, "tp"), P("tp"))  # type: ignore[arg-type]
    return Transformer(P(), block, rep, P())  # type: ignore[arg-type]


def cross_entropy(logits: Any, labels: Any) -> jax.Array:
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))


OPT = optax.chain(st.clip_by_global_norm(1.0), optax.adamw(3e-3, weight_decay=0.01))
REF_OPT = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(3e-3, weight_decay=0.01))


def make_step(mesh: jax.sharding.Mesh) -> Any:
    # no spec trees: each argument's in_spec is its own sharding (the model is placed by
    # `model_specs`, the optimiser state is created from it), the tokens' are `P("dp")`, and
    # the outputs hinted as a parameter (`Transformer`, `Any`) take that parameter's specs
    @jax.jit
    @st.shard_map(mesh=mesh)
    def step(model: Transformer, opt_state: Any, tokens: Varying["dp"],
             labels: Varying["dp"]) -> tuple[Transformer, Any, Invariant]:
        def loss_fn(m: Transformer) -> Invariant:
            return st.pmean(cross_entropy(m(tokens, "tp"), labels), "dp")

        loss, grads = eqx.filter_value_and_grad(loss_fn)(model)  # typed loss, typed grads
        updates, opt_state = OPT.update(grads, opt_state, model)
        return eqx.apply_updates(model, updates), opt_state, loss

    return step


@jax.jit
def reference_step(model: Transformer, opt_state: Any, tokens: jax.Array,
                   labels: jax.Array) -> tuple[Transformer, Any, jax.Array]:
    loss, grads = eqx.filter_value_and_grad(lambda m: cross_entropy(m(tokens), labels))(model)
    updates, opt_state = REF_OPT.update(grads, opt_state, model)
    return eqx.apply_updates(model, updates), opt_state, loss


def data(step: int) -> tuple[np.ndarray, np.ndarray]:
    """A learnable sequence task: the next token is (token * 3 + 1) mod VOCAB."""
    rng = np.random.default_rng(step)
    start = rng.integers(0, VOCAB, (BATCH, 1))
    seq = [start]
    for _ in range(SEQ):
        seq.append((seq[-1] * 3 + 1) % VOCAB)
    toks = np.concatenate(seq, axis=1).astype(np.int32)
    return toks[:, :-1], toks[:, 1:]


def run(verbose: bool = False, steps: int = 12) -> dict[str, Any]:
    mesh = jax.make_mesh((2, 4), ("dp", "tp"))
    step = make_step(mesh)
    model0 = init_model(jax.random.PRNGKey(0))
    model = jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(mesh, s)), model0,
                         model_specs())
    with jax.set_mesh(mesh):  # under the mesh, jit gives every moment its parameter's sharding
        opt_state = jax.jit(OPT.init)(model)
    ref_model, ref_state = model0, REF_OPT.init(model0)
    losses, ref_losses = [], []
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "ckpt.eqx"
        for i in range(steps):
            if i == steps // 2:  # checkpoint: save, then train on from the restored copy
                eqx.tree_serialise_leaves(ckpt, (model, opt_state))
                like = (init_model(jax.random.PRNGKey(1)), OPT.init(model0))
                restored = eqx.tree_deserialise_leaves(ckpt, like)
                # placed as the arrays they replace (after a step every leaf is on the mesh)
                model, opt_state = jax.tree.map(lambda r, a: jax.device_put(r, a.sharding),
                                                restored, (model, opt_state))
            tokens, labels = data(i)
            xs = jax.device_put(tokens, NamedSharding(mesh, P("dp")))
            ys = jax.device_put(labels, NamedSharding(mesh, P("dp")))
            model, opt_state, loss = step(model, opt_state, xs, ys)
            ref_model, ref_state, ref_loss = reference_step(ref_model, ref_state, tokens, labels)
            losses.append(float(loss))
            ref_losses.append(float(ref_loss))
            if verbose:
                print(f"step {i:2d}  loss {losses[-1]:.5f}  single-device {ref_losses[-1]:.5f}")
    # the specs read from the arguments kept the Megatron layout through every step
    for leaf, spec in ((model.block.wqkv, P(None, None, "tp")), (opt_state[1][0].mu.block.w2, P("tp"))):
        assert leaf.sharding.is_equivalent_to(NamedSharding(mesh, spec), leaf.ndim)
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-4)
    for a, b in zip(jax.tree.leaves(model), jax.tree.leaves(ref_model), strict=True):
        assert isinstance(a, jax.Array)
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5)
    assert losses[-1] < losses[0]
    return {"losses": losses, "reference_losses": ref_losses}


if __name__ == "__main__":
    run(verbose=True)
