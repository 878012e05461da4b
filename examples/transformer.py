"""A dp x tp transformer trained on synthetic data: attention heads and MLP columns over tp.

Mesh dp=2 x tp=4 on 8 simulated CPU devices. Each block is Megatron-style: Q/K/V and the
first MLP matrix are column-parallel (`Varying["tp"]`), the output projections row-parallel;
their partial products are declared Unreduced over tp and completed by one `psum` each. The
batch is sharded over dp and the loss averaged with `pmean`, so the gradients of the
tp-sharded parameters come back `Varying["tp"]`, already averaged over dp.

`python examples/transformer.py` trains a few hundred steps with a progress bar and checks
the loss curve against a single-device reference.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import Invariant, Varying

_T = TypeVar("_T", bound="st.SArray[Any, Any, Any]")

D, HEADS, HEAD_DIM, FF = 32, 8, 8, 64
LAYERS = 2
LR = 0.3
LAYER_SPECS = {"wq": P(None, "tp"), "wk": P(None, "tp"), "wv": P(None, "tp"), "wo": P("tp", None),
               "w1": P(None, "tp"), "w2": P("tp", None)}

#: (name, state, local shape) of values in one traced step, when enabled by `trace_step`
TRACE: list[tuple[str, str, tuple[int, ...]]] | None = None


def _show(name: str, v: _T) -> _T:
    if TRACE is not None and not any(n == name for n, _, _ in TRACE):
        TRACE.append((name, str(st.typeof(v)), tuple(v.shape)))
    return v


def make_mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((2, 4), ("dp", "tp"))


def param_specs(layers: int = LAYERS) -> list[dict[str, P]]:
    return [dict(LAYER_SPECS) for _ in range(layers)]


def block(x: Varying["dp"], p: dict[str, Varying["tp"]]) -> Varying["dp"]:
    b, s, _ = x.shape
    q = _show("q = x @ wq", x @ p["wq"])                       # Varying["dp", "tp"]
    k, v = x @ p["wk"], x @ p["wv"]
    heads = q.shape[-1] // HEAD_DIM                           # heads on this device
    q, k, v = (t.reshape(b, s, heads, HEAD_DIM) for t in (q, k, v))
    scores = st.numpy.einsum("bqhd,bkhd->bhqk", q, k) * (1.0 / HEAD_DIM**0.5)
    attn = _show("softmax(scores)", st.nn.softmax(scores, axis=-1))
    o = st.numpy.einsum("bhqk,bkhd->bqhd", attn, v).reshape(b, s, heads * HEAD_DIM)
    partial = _show("o @ wo (partial)", st.pcast(o @ p["wo"], "tp", to="unreduced"))
    x = _show("x + psum(o @ wo)", x + st.psum(partial, "tp"))
    h = _show("tanh(x @ w1)", st.numpy.tanh(x @ p["w1"]))
    return x + st.psum(st.pcast(h @ p["w2"], "tp", to="unreduced"), "tp")


def loss_fn(params: list[dict[str, Varying["tp"]]], x: Varying["dp"], y: Varying["dp"]) -> Invariant:
    for p in params:
        x = block(x, p)
    err = _show("err", x - y)
    return _show("loss = pmean(mean(err²), 'dp')", st.pmean((err * err).mean(), "dp"))


def step(params: list[dict[str, Varying["tp"]]], x: Varying["dp"],
         y: Varying["dp"]) -> tuple[list[dict[str, Varying["tp"]]], Invariant]:
    loss, grads = st.value_and_grad(loss_fn)(params, x, y)
    _show("grad wq", grads[0]["wq"])
    new = jax.tree_util.tree_map(lambda w, g: w - LR * g, params, grads,
                                 is_leaf=lambda v: isinstance(v, st.SArray))
    return new, loss


# ------------------------------------------------------------------ the raw twin and reference

def _block_raw(x, p, psum: Callable[..., Any]):  # type: ignore[no-untyped-def]
    b, s, _ = x.shape
    q, k, v = x @ p["wq"], x @ p["wk"], x @ p["wv"]
    heads = q.shape[-1] // HEAD_DIM
    q, k, v = (t.reshape(b, s, heads, HEAD_DIM) for t in (q, k, v))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (1.0 / HEAD_DIM**0.5)
    attn = jax.nn.softmax(scores, axis=-1)
    o = jnp.einsum("bhqk,bkhd->bqhd", attn, v).reshape(b, s, heads * HEAD_DIM)
    x = x + psum(o @ p["wo"])
    return x + psum(jnp.tanh(x @ p["w1"]) @ p["w2"])


def step_raw(params, x, y):  # type: ignore[no-untyped-def]
    def psum(v):  # type: ignore[no-untyped-def]
        return jax.lax.psum(jax.lax.pcast(v, "tp", to="unreduced"), "tp")

    def loss_raw(params):  # type: ignore[no-untyped-def]
        h = x
        for p in params:
            h = _block_raw(h, p, psum)
        err = h - y
        return jax.lax.pmean((err * err).mean(), "dp")

    loss, grads = jax.value_and_grad(loss_raw)(params)
    return jax.tree_util.tree_map(lambda w, g: w - LR * g, params, grads), loss


def step_reference(params, x, y):  # type: ignore[no-untyped-def]
    def loss_ref(params):  # type: ignore[no-untyped-def]
        h = x
        for p in params:
            h = _block_raw(h, p, lambda v: v)
        return jnp.mean((h - y) ** 2)

    loss, grads = jax.value_and_grad(loss_ref)(params)
    return jax.tree_util.tree_map(lambda w, g: w - LR * g, params, grads), loss


def host_inputs(batch: int = 8, seq: int = 8, layers: int = LAYERS, seed: int = 0):  # type: ignore[no-untyped-def]
    """(params, x, y) as NumPy arrays: y is a fixed random linear map of a shifted x."""
    key = jax.random.key(seed)
    kx, kt, *kl = jax.random.split(key, 2 + layers)
    x = jax.random.normal(kx, (batch, seq, D))
    y = jnp.roll(x, 1, axis=1) @ (jax.random.normal(kt, (D, D)) / D**0.5)
    params = []
    for k in kl:
        ks = jax.random.split(k, 6)
        shapes = {"wq": (D, HEADS * HEAD_DIM), "wk": (D, HEADS * HEAD_DIM), "wv": (D, HEADS * HEAD_DIM),
                  "wo": (HEADS * HEAD_DIM, D), "w1": (D, FF), "w2": (FF, D)}
        params.append({n: np.asarray(jax.random.normal(kk, shp) / shp[0] ** 0.5 * 0.5)
                       for kk, (n, shp) in zip(ks, shapes.items(), strict=False)})
    return params, np.asarray(x), np.asarray(y)


def make_inputs(mesh: jax.sharding.Mesh, batch: int = 8, seq: int = 8, layers: int = LAYERS,
                seed: int = 0, put: Callable[[Any, Any], Any] | None = None):  # type: ignore[no-untyped-def]
    """(params, x, y) placed on `mesh` with their specs. `put(array, sharding)` defaults to
    `jax.device_put`; multi-process runs pass `jax.make_array_from_callback`-based placement."""
    params, x, y = host_inputs(batch, seq, layers, seed)
    place = put or jax.device_put

    def on(a: Any, spec: P) -> Any:
        return place(a, NamedSharding(mesh, spec))

    params = [{n: on(w, LAYER_SPECS[n]) for n, w in p.items()} for p in params]
    return params, on(x, P("dp")), on(y, P("dp"))


def specs(layers: int = LAYERS) -> tuple[tuple[Any, P, P], tuple[Any, P]]:
    return (param_specs(layers), P("dp"), P("dp")), (param_specs(layers), P())


def programs(mesh: jax.sharding.Mesh, layers: int = LAYERS):  # type: ignore[no-untyped-def]
    in_specs, out_specs = specs(layers)
    typed = jax.jit(st.shard_map(step, mesh=mesh, in_specs=in_specs, out_specs=out_specs))
    raw = jax.jit(jax.shard_map(step_raw, mesh=mesh, in_specs=in_specs, out_specs=out_specs))
    return typed, raw


def trace_step(mesh: jax.sharding.Mesh) -> list[tuple[str, str, tuple[int, ...]]]:
    """The state and local shape of the named values of one step (traced, not run)."""
    global TRACE
    TRACE = []
    try:
        in_specs, out_specs = specs()
        jax.jit(st.shard_map(step, mesh=mesh, in_specs=in_specs, out_specs=out_specs)).trace(
            *make_inputs(mesh))
        return TRACE
    finally:
        TRACE = None


def _progress(i: int, n: int, loss: float, start: float, out: Any) -> None:
    if i not in (1, n) and i % max(1, n // 50):
        return  # ~50 redraws per run (logs without a terminal stay short)
    width = 30
    done = int(width * i / n)
    rate = i / max(time.perf_counter() - start, 1e-9)
    out.write(f"\r[{'#' * done}{'.' * (width - done)}] {i:4d}/{n} loss {loss:.5f} "
              f"{rate:6.1f} steps/s")
    if i == n:
        out.write("\n")
    out.flush()


def train(steps: int = 300, verbose: bool = True, check_every: int = 50) -> dict[str, Any]:
    """Train `steps` steps; every `check_every` steps compare with the raw twin and the
    single-device reference (same parameters, one step)."""
    mesh = make_mesh()
    params, x, y = make_inputs(mesh)
    typed, raw = programs(mesh)
    losses = []
    start = time.perf_counter()
    for i in range(1, steps + 1):
        if i % check_every == 1 or check_every == 1:
            raw_params, raw_loss = raw(params, x, y)
            ref_params, ref_loss = step_reference(jax.device_get(params), np.asarray(x), np.asarray(y))
        new_params, loss = typed(params, x, y)
        if i % check_every == 1 or check_every == 1:
            assert float(loss) == float(raw_loss), "typed != raw"
            np.testing.assert_allclose(float(loss), float(ref_loss), rtol=2e-4)
            for a, b in zip(jax.tree_util.tree_leaves(new_params), jax.tree_util.tree_leaves(raw_params), strict=False):
                assert np.array_equal(np.asarray(a), np.asarray(b)), "typed != raw parameters"
        params = new_params
        losses.append(float(loss))
        if verbose:
            _progress(i, steps, losses[-1], start, sys.stdout)
    assert losses[-1] < 0.5 * losses[0], f"loss did not go down: {losses[0]} -> {losses[-1]}"
    return {"losses": losses, "seconds": time.perf_counter() - start}


if __name__ == "__main__":
    result = train()
    print(f"loss {result['losses'][0]:.4f} -> {result['losses'][-1]:.4f} in "
          f"{len(result['losses'])} steps ({result['seconds']:.1f} s)")
