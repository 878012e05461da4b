"""Trace + lower time, typed / raw: `examples/transformer.py` with `layers=32` and 128 (dp=2 x
tp=4), forward and backward, `jax.jit(...).lower(*inputs)`; and the engine's check alone
(`walk_cost`: per equation, and as a share of one raw trace + lower).

Each measurement lowers a program built fresh by `programs(mesh, layers=...)` (untimed), so
no jit cache has seen it; JAX's own per-primitive caches are warm for both after one warm-up
lowering each. Typed and raw alternate round by round; the main clock is the thread's CPU
time (`time.thread_time`: tracing and lowering run on the calling thread, and CPU time does
not count the time the VM spends running other processes), with wall time alongside. A
second, shorter series runs the typed program with `st.check_mode(False)` (no comparison of
each predicted state with JAX's).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import Timings, import_example, interleaved


@dataclass
class TraceResult:
    layers: int
    cpu: Timings           # thread CPU seconds, check mode on (the default)
    wall: Timings          # wall seconds, same runs
    check_off: Timings     # typed with st.check_mode(False) vs raw, thread CPU seconds


def run(layers: int = 32, rounds: int = 10, check_off_rounds: int = 4) -> TraceResult:
    import spmdtyped as st

    m = import_example("transformer")
    mesh = m.make_mesh()
    args = m.make_inputs(mesh, layers=layers)

    def fresh(which: int) -> Any:
        return m.programs(mesh, layers=layers)[which]

    for which in (0, 1):  # warm JAX's per-primitive caches for both
        fresh(which).lower(*args)

    def lower(program: Any) -> None:
        program.lower(*args)

    def lower_unchecked(program: Any) -> None:
        with st.check_mode(False):
            program.lower(*args)

    wall, cpu = interleaved(lower, lower, rounds, cpu_clock=time.thread_time, prepare=fresh)
    _, off = interleaved(lower_unchecked, lower, check_off_rounds, cpu_clock=time.thread_time,
                         prepare=fresh)
    return TraceResult(layers, cpu, wall, off)


def run_drop_in(layers: int = 128, rounds: int = 8) -> Timings:
    """The same step as the code users write (`examples/transformer.py`'s `step_raw`: jnp and
    `jax.lax` in the body, `jax.value_and_grad`) under the drop-in
    `st.adapters.typed_shard_map` (the engine on) vs `jax.shard_map`, traced and lowered
    alternately as `run` does; thread CPU seconds. The typed row of `run` adds the `st.*`
    dialect's own checks of typed values to the engine."""
    import jax

    from spmdtyped.adapters import typed_shard_map

    m = import_example("transformer")
    mesh = m.make_mesh()
    args = m.make_inputs(mesh, layers=layers)
    in_specs, out_specs = m.specs(layers)

    def fresh(which: int) -> Any:
        smap = typed_shard_map if which == 0 else jax.shard_map
        return jax.jit(smap(m.step_raw, mesh=mesh, in_specs=in_specs, out_specs=out_specs))

    for which in (0, 1):
        fresh(which).lower(*args)

    def lower(program: Any) -> None:
        program.lower(*args)

    _, cpu = interleaved(lower, lower, rounds, cpu_clock=time.thread_time, prepare=fresh)
    return cpu


def profile(layers: int = 32) -> tuple[float, float]:
    """Noise-free view of the same work: (Python function calls typed / raw, share of the
    typed trace + lower spent in spmdtyped's own frames), from one cProfile run of each."""
    import cProfile
    import pstats

    import spmdtyped as st

    m = import_example("transformer")
    mesh = m.make_mesh()
    args = m.make_inputs(mesh, layers=layers)
    stats = []
    for which in (0, 1):
        m.programs(mesh, layers=layers)[which].lower(*args)  # warm, as in `run`
        program = m.programs(mesh, layers=layers)[which]
        prof = cProfile.Profile()
        prof.enable()
        program.lower(*args)
        prof.disable()
        stats.append(pstats.Stats(prof).stats)  # type: ignore[attr-defined]
    calls = [sum(v[1] for v in s.values()) for s in stats]
    total = sum(v[2] for v in stats[0].values())
    package = str(Path(st.__file__).resolve().parent)
    own = sum(v[2] for k, v in stats[0].items() if k[0].startswith(package))
    return calls[0] / calls[1], own / total


def walk_cost(layers: int = 32, rounds: int = 5) -> tuple[int, float, float]:
    """The engine's share, measured alone: `(equations, seconds, raw trace + lower seconds)`:
    the check of the typed program's staged shard_map (`_engine.check.check_staged`: the
    four-state walk, the boundary and the refinement walk, as every face runs it; minimum over
    `rounds` checks of the same traced program, thread CPU) next to one raw lowering."""
    import jax

    from spmdtyped._engine import check as engine

    m = import_example("transformer")
    mesh = m.make_mesh()
    args = m.make_inputs(mesh, layers=layers)
    closed = jax.make_jaxpr(m.programs(mesh, layers=layers)[0])(*args)
    best = float("inf")
    for _ in range(rounds):
        t0 = time.thread_time()
        engine.check_staged(closed, where="bench")
        best = min(best, time.thread_time() - t0)
    raw = m.programs(mesh, layers=layers)[1]
    t0 = time.thread_time()
    raw.lower(*args)
    raw_s = time.thread_time() - t0
    n = sum(len(getattr(e.params["jaxpr"], "jaxpr", e.params["jaxpr"]).eqns)
            for e in engine.staged_shard_maps(closed))
    return n, best, raw_s


def unchecked_cost(layers: int = 128, rounds: int = 5) -> tuple[int, float, float]:
    """The walk of what a `check_vma=False` program computes (`_engine.unchecked`, what
    `typed_shard_map(..., check_vma=False)` and `checking(step)` add to JAX's own trace),
    alone: `(equations, seconds, raw trace + lower seconds)` on a training step written for
    `check_vma=False` (`layers` tensor-parallel MLP blocks, Megatron's copy / all-reduce
    pair, `jax.value_and_grad`, the gradients pmean'd over dp; the example transformer
    casts to Unreduced, which needs the checks), minimum over `rounds` checks, thread CPU,
    next to one lowering of it."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from spmdtyped._engine import check as engine

    mesh = import_example("transformer").make_mesh()

    @jax.custom_vjp
    def all_reduce(y: Any) -> Any:
        return jax.lax.psum(y, "tp")

    all_reduce.defvjp(lambda y: (all_reduce(y), None), lambda _, ct: (ct,))

    @jax.custom_vjp
    def copy_to_tp(h: Any) -> Any:
        return h

    copy_to_tp.defvjp(lambda h: (h, None), lambda _, ct: (jax.lax.psum(ct, "tp"),))

    def step(ws: Any, x: Any) -> Any:
        def loss(ws: Any) -> Any:
            h = x
            for w1, w2 in ws:
                h = h + all_reduce(jnp.tanh(copy_to_tp(h) @ w1) @ w2)
            return jnp.mean(h ** 2)

        value, grads = jax.value_and_grad(loss)(ws)
        return jax.lax.pmean(value, "dp"), jax.lax.pmean(grads, "dp")

    specs = [(P(None, "tp"), P("tp", None)) for _ in range(layers)]
    put = jax.device_put
    ws = [(put(jnp.ones((16, 32)) / 16, NamedSharding(mesh, s1)),
           put(jnp.ones((32, 16)) / 32, NamedSharding(mesh, s2))) for s1, s2 in specs]
    x = put(jnp.ones((8, 16)), NamedSharding(mesh, P("dp")))

    def program() -> Any:
        return jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(specs, P("dp")),
                                     out_specs=(P(), specs), check_vma=False))

    closed = jax.make_jaxpr(program())(ws, x)
    best = float("inf")
    for _ in range(rounds):
        t0 = time.thread_time()
        found = engine.check_staged(closed, where="bench")
        best = min(best, time.thread_time() - t0)
    assert not found, found   # the step is right
    program().lower(ws, x)   # warm JAX's per-primitive caches
    t0 = time.thread_time()
    program().lower(ws, x)
    raw_s = time.thread_time() - t0
    n = sum(len(getattr(e.params["jaxpr"], "jaxpr", e.params["jaxpr"]).eqns)
            for e in engine.staged_shard_maps(closed))
    return n, best, raw_s


if __name__ == "__main__":
    import os
    import sys

    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    from _common import setup_path

    setup_path()
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    r = run(rounds=rounds)
    print(f"cpu   typed/raw {r.cpu.ratio:.3f}  typed min {min(r.cpu.a):.3f}s raw min {min(r.cpu.b):.3f}s  "
          f"{r.cpu.spread()}")
    print(f"wall  typed/raw {r.wall.ratio:.3f}  {r.wall.spread()}")
    print(f"check off: typed/raw {r.check_off.ratio:.3f}  {r.check_off.spread()}")
    # issue 27: the 128-layer program, the engine on (st.shard_map walks the staged jaxpr with
    # the four states and Shard / Partial / Rep) vs raw jax.shard_map: target <= 1.10
    big = run(layers=128, rounds=max(2, rounds // 3), check_off_rounds=1)
    print(f"128 layers, engine on: cpu typed/raw {big.cpu.ratio:.3f}  "
          f"typed min {min(big.cpu.a):.3f}s raw min {min(big.cpu.b):.3f}s  {big.cpu.spread()}")
    drop_in = run_drop_in(128, rounds=max(2, rounds // 3))
    print(f"128 layers, the raw step under typed_shard_map (the engine on the code users "
          f"write): cpu typed/raw {drop_in.ratio:.3f}  typed min {min(drop_in.a):.3f}s raw min "
          f"{min(drop_in.b):.3f}s  {drop_in.spread()}")
    calls, share = profile(32)
    print(f"32 layers, Python function calls typed / raw {calls:.3f} (counted: steady on a "
          f"noisy machine); spmdtyped's own frames {share:.1%} of the typed trace + lower")
    n, walk_s, raw_s = walk_cost(32)
    print(f"engine alone, 32 layers: {n} equations, {walk_s * 1e3:.1f} ms "
          f"({walk_s / n * 1e6:.1f} us per equation; {walk_s / raw_s:.1%} of one raw trace + lower)")
    n, walk_s, raw_s = unchecked_cost()
    print(f"128 layers, check_vma=False: the unchecked walk {walk_s * 1e3:.1f} ms over {n} "
          f"equations = {walk_s / raw_s:.3f} of one raw trace + lower ({raw_s:.3f}s)")
