"""`st.report` of the `examples/transformer.py` step with `layers=128` (dp=2 x tp=4, forward
and backward) against its trace + lower time. Printed ratios, never asserted.

Three timings on fresh programs (no jit cache has seen them): `jax.jit(step).trace(*args)
.lower()` (the baseline), `st.report(step, *args, compile=False)` (trace + the jaxpr walk +
flags), and the full `st.report` (which compiles as well: the compile dominates, and is the
price of the ground truth).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from _common import import_example


def run(layers: int = 128, rounds: int = 3, compile: bool = True) -> dict[str, float]:
    import jax

    import spmdtyped as st

    m = import_example("transformer")
    mesh = m.make_mesh()
    args = m.make_inputs(mesh, layers=layers)

    def fresh() -> Any:
        return m.programs(mesh, layers=layers)[0]

    fresh().lower(*args)  # warm JAX's per-primitive caches
    out: dict[str, list[float]] = {"trace+lower": [], "report (no compile)": []}
    if compile:
        out["report"] = []
    for _ in range(rounds):
        for name in out:
            p = fresh()
            t0 = time.thread_time()   # CPU time of this thread: other load does not count
            if name == "trace+lower":
                jax.jit(p).trace(*args).lower()
            else:
                rep = st.report(p, *args, compile=name == "report")
            out[name].append(time.thread_time() - t0)
    best = {k: min(v) for k, v in out.items()}
    base = best["trace+lower"]
    print(f"layers={layers}: collectives {len(rep.collectives)}, equations {rep.equations}")
    for k, v in best.items():
        print(f"  {k:22s} {v:7.3f}s CPU  x{v / base:.2f} of trace+lower")
    return best


if __name__ == "__main__":
    # python bench_report.py [LAYERS [ROUNDS [--no-compile]]]
    run(int(sys.argv[1]) if len(sys.argv) > 1 else 128,
        int(sys.argv[2]) if len(sys.argv) > 2 else 3, "--no-compile" not in sys.argv)
