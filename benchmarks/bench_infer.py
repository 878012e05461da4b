"""Porting tools' cost: `typed_shard_map` cold trace + lower over raw `jax.shard_map`, and
`infer` time against program size.

The model is a raw (unannotated) dp x tp MLP stack written as real code is: `jax.lax.psum`
calls, a loss `pmean` over dp, forward and backward (`jax.value_and_grad` inside the body).

1. **Cold trace + lower ratio**: `jax.jit(typed_shard_map(step)).lower(*args)` over
   `jax.jit(jax.shard_map(step)).lower(*args)`, each on a freshly built step function (no
   cache has seen it), interleaved (`_common.interleaved`), thread CPU time, minimum over
   rounds. `typed_shard_map` traces the body once (the jaxpr it checks is the one JAX lowers),
   so the ratio is 1 + the walk's cost. Goal: <= 1.10 at 128 layers. Printed with the
   median of the rounds' ratios and its quartiles (steadier than the ratio of minimums).
2. **The engine alone**: the check of the same program's staged shard_map, timed by itself
   (the whole difference between the two; steadier than their ratio on a noisy machine).
3. **infer scaling**: `st.adapters.infer(step, ...)` at 32, 64, 128, 256, 512 layers; time
   per layer should stay flat (linear growth).

Run: `python benchmarks/bench_infer.py [--layers 128] [--rounds 6]`.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse  # noqa: E402
import gc  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

from _common import fmt_s, interleaved, setup_path  # noqa: E402

D = 64


def make_step(layers: int) -> Any:
    """A fresh raw per-shard training step (new function objects: a cold cache)."""
    import jax
    import jax.numpy as jnp

    def loss_fn(ws, x, y):
        h = x
        for w1, w2 in ws:
            h = jax.lax.psum(jax.nn.relu(h @ w1) @ w2, "tp") + h
        return jax.lax.pmean(jnp.mean((h - y) ** 2), "dp")

    def step(ws, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(ws, x, y)
        return loss, grads

    return step


def make_args(mesh: Any, layers: int) -> tuple[Any, ...]:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def put(a: Any, spec: Any) -> Any:
        return jax.device_put(a, NamedSharding(mesh, spec))

    ws = [(put(jnp.full((D, 4 * D), 0.01), P(None, "tp")), put(jnp.full((4 * D, D), 0.01), P("tp", None)))
          for _ in range(layers)]
    return ws, put(jnp.ones((16, D)), P("dp")), put(jnp.ones((16, D)), P("dp"))


def specs(layers: int) -> tuple[Any, Any]:
    from jax.sharding import PartitionSpec as P

    ws = [(P(None, "tp"), P("tp", None))] * layers
    return (ws, P("dp"), P("dp")), (P(), ws)


def trace_lower_ratio(layers: int, rounds: int) -> tuple[float, float, float, list[float]]:
    import jax

    import spmdtyped as st

    mesh = jax.make_mesh((2, 4), ("dp", "tp"))
    args = make_args(mesh, layers)
    in_specs, out_specs = specs(layers)

    def prepare(which: int) -> Any:
        make = jax.shard_map if which == 0 else st.adapters.typed_shard_map
        return jax.jit(make(make_step(layers), mesh=mesh, in_specs=in_specs,
                            out_specs=out_specs))

    for which in (0, 1):  # warm JAX's per-primitive caches for both
        prepare(which).lower(*args)
    _wall, cpu = interleaved(lambda p: p.lower(*args), lambda p: p.lower(*args), rounds,
                             cpu_clock=time.thread_time, prepare=prepare)
    return min(cpu.a), min(cpu.b), min(cpu.b) / min(cpu.a), \
        sorted(typed / raw for raw, typed in zip(cpu.a, cpu.b, strict=True))


def _quartiles(ratios: list[float]) -> str:
    """The median of the rounds' typed / raw ratios and its quartiles: steadier than the ratio
    of minimums, which takes each variant's least disturbed round from a different round."""
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else ratios * 3
    return f"median round ratio {statistics.median(ratios):.3f} [q1 {q[0]:.3f}, q3 {q[2]:.3f}]"


def engine_time(layers: int, rounds: int) -> tuple[int, float]:
    """The engine alone on the drop-in's program: `(equations, seconds)`, the check every face
    runs (`_engine.check.check_staged`: the four-state walk, the boundary and the refinement
    walk) of the staged shard_map of a freshly traced step (no memo of the engine has seen
    it), minimum over `rounds`, thread CPU. Steadier than the trace + lower ratio on a noisy
    machine: it is the whole difference between the two (docs/performance.md §2)."""
    import jax

    from spmdtyped._engine import check as engine

    mesh = jax.make_mesh((2, 4), ("dp", "tp"))
    args = make_args(mesh, layers)
    in_specs, out_specs = specs(layers)
    best, n = float("inf"), 0
    for _ in range(rounds):
        closed = jax.make_jaxpr(jax.shard_map(make_step(layers), mesh=mesh, in_specs=in_specs,
                                              out_specs=out_specs))(*args)
        gc.collect()
        t0 = time.thread_time()
        found = engine.check_staged(closed, where="bench")
        best = min(best, time.thread_time() - t0)
        assert not found, found
        n = sum(len(getattr(e.params["jaxpr"], "jaxpr", e.params["jaxpr"]).eqns)
                for e in engine.staged_shard_maps(closed))
    return n, best


def infer_time(layers: int, rounds: int = 3) -> float:
    import jax

    import spmdtyped as st

    mesh = jax.make_mesh((2, 4), ("dp", "tp"))
    args = make_args(mesh, layers)
    in_specs, out_specs = specs(layers)
    best = float("inf")
    for _ in range(rounds):
        step = make_step(layers)
        t0 = time.thread_time()
        rep = st.adapters.infer(step, *args, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
        best = min(best, time.thread_time() - t0)
        assert rep.ok, rep
    return best


def main() -> None:
    setup_path()
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--sizes", default="32,64,128,256,512")
    args = parser.parse_args()
    raw, typed, ratio, ratios = trace_lower_ratio(args.layers, args.rounds)
    print(f"cold trace+lower, {args.layers} layers (thread CPU, min of {args.rounds}): "
          f"raw {fmt_s(raw)}, typed_shard_map {fmt_s(typed)}, ratio {ratio:.3f}; "
          f"{_quartiles(ratios)}")
    n, check = engine_time(args.layers, args.rounds)
    print(f"the engine alone: {n} top-level equations, {fmt_s(check)} (min of {args.rounds}), "
          f"{check / raw:.1%} of the raw trace + lower")
    print("infer time by program size:")
    print(f"{'layers':>8s} {'infer':>10s} {'per layer':>10s}")
    for n in map(int, args.sizes.split(",")):
        t = infer_time(n)
        print(f"{n:8d} {fmt_s(t):>10s} {fmt_s(t / n):>10s}")


if __name__ == "__main__":
    main()
