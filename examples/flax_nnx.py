"""A flax nnx transformer trained with optax.adamw and st.clip_by_global_norm on a dp x tp mesh.

The same Megatron layout as `equinox_optax.py`, written with `nnx.Module`s (`nnx.Embed`,
`nnx.LayerNorm`, `nnx.Linear`, `nnx.Param`). The model is split into a graph definition and its
parameter state (an `nnx.State`, a pytree); the state goes through `st.shard_map`, which reads
each parameter's spec from its sharding (no spec tree is written for the step), and
`nnx.merge` rebuilds the module inside. Halfway through, the
parameters and the optimiser state are saved with orbax and restored, sharded, from disk. The
loss curve and the final parameters equal a single-device run to rtol 2e-4.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # type: ignore[import-untyped]  # noqa: E402
import orbax.checkpoint as ocp  # type: ignore[import-untyped]  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import spmdtyped as st  # noqa: E402
from spmdtyped import Invariant, Varying  # noqa: E402

VOCAB, D, HEADS, DH, FF, SEQ, BATCH = 64, 32, 4, 8, 64, 16, 8


def _psum_tp(y: Any, tp: str | None) -> Any:
    return st.psum(y, tp) if tp else y


class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        init = nnx.initializers.normal(1.0 / np.sqrt(D))
        self.ln1 = nnx.LayerNorm(D, rngs=rngs)
        self.wqkv = nnx.Param(init(rngs.params(), (D, 3, HEADS, DH)))  # heads sharded over tp
        self.wo = nnx.Param(init(rngs.params(), (HEADS, DH, D)))  # row-parallel
        self.ln2 = nnx.LayerNorm(D, rngs=rngs)
        self.up = nnx.Linear(D, FF, use_bias=False, rngs=rngs)  # column-parallel
        self.down = nnx.Linear(FF, D, use_bias=False, rngs=rngs)  # row-parallel
        self.down_bias = nnx.Param(jnp.zeros(D))  # added once, after the tp reduction

    def __call__(self, x: Any, tp: str | None) -> Any:
        h = self.ln1(x)
        q, k, v = jnp.unstack(jnp.einsum("bsd,dthe->tbhse", h, self.wqkv[...]), axis=0)
        scores = jnp.einsum("bhse,bhte->bhst", q, k) / np.sqrt(DH)
        mask = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), bool))
        att = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
        o = jnp.einsum("bhst,bhte->bhse", att, v)
        x = x + _psum_tp(jnp.einsum("bhse,hed->bsd", o, self.wo[...]), tp)
        h = jax.nn.gelu(self.up(self.ln2(x)))
        return x + _psum_tp(self.down(h), tp) + self.down_bias[...]


class Transformer(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Embed(VOCAB, D, rngs=rngs)
        self.block = Block(rngs)
        self.ln_f = nnx.LayerNorm(D, rngs=rngs)
        self.head = nnx.Linear(D, VOCAB, rngs=rngs)

    def __call__(self, tokens: Any, tp: str | None = None) -> Any:
        return self.head(self.ln_f(self.block(self.embed(tokens), tp)))


#: parameter path -> PartitionSpec (every other parameter is replicated)
SHARDED = {("block", "wqkv"): P(None, None, "tp"), ("block", "wo"): P("tp"),
           ("block", "up", "kernel"): P(None, "tp"), ("block", "down", "kernel"): P("tp")}


def param_specs(params: nnx.State) -> Any:
    def spec(path: tuple[Any, ...], _leaf: Any) -> P:
        keys = tuple(str(getattr(k, "key", getattr(k, "name", k))) for k in path)
        return next((s for p, s in SHARDED.items() if keys[:len(p)] == p), P())

    return jax.tree_util.tree_map_with_path(spec, params)


def cross_entropy(logits: Any, labels: Any) -> jax.Array:
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))


OPT = optax.chain(st.clip_by_global_norm(1.0), optax.adamw(3e-3, weight_decay=0.01))
REF_OPT = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(3e-3, weight_decay=0.01))


def make_step(mesh: jax.sharding.Mesh, graphdef: Any) -> Any:
    # no spec trees: each argument's in_spec is its own sharding (the parameters are placed by
    # `param_specs`, the optimiser state is created from them), the tokens' are `P("dp")`, and
    # the outputs hinted as a parameter (`nnx.State`, `Any`) take that parameter's specs
    @jax.jit
    @st.shard_map(mesh=mesh)
    def step(params: nnx.State, opt_state: Any, tokens: Varying["dp"],
             labels: Varying["dp"]) -> tuple[nnx.State, Any, Invariant]:
        def loss_fn(p: nnx.State) -> Invariant:
            model = nnx.merge(graphdef, p)
            return st.pmean(cross_entropy(model(tokens, "tp"), labels), "dp")

        loss, grads = jax.value_and_grad(loss_fn)(params)  # typed loss, typed grads
        updates, opt_state = OPT.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def make_reference_step(graphdef: Any) -> Any:
    @jax.jit
    def reference_step(params: nnx.State, opt_state: Any, tokens: jax.Array,
                       labels: jax.Array) -> tuple[nnx.State, Any, jax.Array]:
        def loss_fn(p: nnx.State) -> jax.Array:
            return cross_entropy(nnx.merge(graphdef, p)(tokens), labels)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = REF_OPT.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return reference_step


def data(step: int) -> tuple[np.ndarray, np.ndarray]:
    """A learnable sequence task: the next token is (token * 3 + 1) mod VOCAB."""
    rng = np.random.default_rng(step)
    seq = [rng.integers(0, VOCAB, (BATCH, 1))]
    for _ in range(SEQ):
        seq.append((seq[-1] * 3 + 1) % VOCAB)
    toks = np.concatenate(seq, axis=1).astype(np.int32)
    return toks[:, :-1], toks[:, 1:]


def run(verbose: bool = False, steps: int = 12) -> dict[str, Any]:
    mesh = jax.make_mesh((2, 4), ("dp", "tp"))
    graphdef, params0 = nnx.split(Transformer(nnx.Rngs(0)), nnx.Param)
    step = make_step(mesh, graphdef)
    reference_step = make_reference_step(graphdef)
    params = jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(mesh, s)), params0,
                          param_specs(params0))
    with jax.set_mesh(mesh):  # under the mesh, jit gives every moment its parameter's sharding
        opt_state = jax.jit(OPT.init)(params)
    ref_params, ref_state = params0, REF_OPT.init(params0)
    losses, ref_losses = [], []
    with tempfile.TemporaryDirectory() as tmp, ocp.StandardCheckpointer() as ckptr:
        for i in range(steps):
            if i == steps // 2:  # checkpoint: save, then train on from the restored copy
                path = Path(tmp) / "ckpt"
                ckptr.save(path, {"params": params, "opt": opt_state})
                ckptr.wait_until_finished()
                target = jax.tree.map(ocp.utils.to_shape_dtype_struct, {"params": params, "opt": opt_state})
                restored = ckptr.restore(path, target)
                params, opt_state = restored["params"], restored["opt"]
            tokens, labels = data(i)
            xs = jax.device_put(tokens, NamedSharding(mesh, P("dp")))
            ys = jax.device_put(labels, NamedSharding(mesh, P("dp")))
            params, opt_state, loss = step(params, opt_state, xs, ys)
            ref_params, ref_state, ref_loss = reference_step(ref_params, ref_state, tokens, labels)
            losses.append(float(loss))
            ref_losses.append(float(ref_loss))
            if verbose:
                print(f"step {i:2d}  loss {losses[-1]:.5f}  single-device {ref_losses[-1]:.5f}")
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-4)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params), strict=True):
        assert isinstance(a, jax.Array)
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5)
    assert losses[-1] < losses[0]
    return {"losses": losses, "reference_losses": ref_losses}


if __name__ == "__main__":
    run(verbose=True)
