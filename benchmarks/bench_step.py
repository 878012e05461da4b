"""Compiled step time, typed / raw: each example's `programs(mesh)` called on its
`make_inputs(mesh)` after compilation, until `block_until_ready`.

Both programs are the jitted functions the examples return (so dispatch is included, as in a
training loop). One measurement is `calls` back-to-back calls (~5 ms: long enough for the
timer, short enough that many measurements fall between other processes' bursts on a shared
machine); typed and raw alternate for many rounds and the minimum per call is kept, in wall
time and in process CPU time (XLA runs the 8 simulated devices on several threads; CPU time
does not count the time the VM gives to other processes). The optimized HLO of the two
executables is compared too (metadata stripped): for identical executables any difference in
time is noise.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from _common import Timings, import_example, interleaved


@dataclass
class StepResult:
    name: str
    calls: int
    wall: Timings          # seconds per call
    cpu: Timings           # process CPU seconds per call (all XLA threads)
    compiled_identical: bool  # optimized HLO equal, metadata stripped


def compiled_text(compiled: Any) -> str:
    """The optimized HLO of a compiled executable without names and source metadata."""
    text = compiled.as_text()
    text = re.sub(r"^HloModule [^,\s]+", "HloModule program", text, count=1)
    text = re.sub(r"\n(FileNames|FunctionNames|FileLocations|StackFrames)\n(?:[^\n]+\n)*", "\n",
                  text)
    return re.sub(r",? metadata=\{[^{}]*\}", "", text)


def _block(out: Any) -> None:
    import jax

    jax.block_until_ready(out)


def run_one(name: str, rounds: int = 60, target_s: float = 0.005) -> StepResult:
    m = import_example(name)
    mesh = m.make_mesh()
    args = m.make_inputs(mesh)
    typed, raw = m.programs(mesh)
    compiled_identical = (compiled_text(typed.lower(*args).compile())
                          == compiled_text(raw.lower(*args).compile()))
    for f in (typed, raw):  # compile and warm up
        for _ in range(3):
            _block(f(*args))
    t0 = time.perf_counter()
    _block(raw(*args))
    one = max(time.perf_counter() - t0, 1e-6)
    calls = max(1, min(50, int(target_s / one)))

    def loop(f: Any) -> Any:
        def go(_: Any) -> None:
            out = None
            for _ in range(calls):
                out = f(*args)
            _block(out)
        return go

    wall, cpu = interleaved(loop(typed), loop(raw), rounds)

    def per_call(t: Timings) -> Timings:
        return Timings([x / calls for x in t.a], [x / calls for x in t.b])

    return StepResult(name, calls, per_call(wall), per_call(cpu), compiled_identical)


if __name__ == "__main__":
    import os
    import sys

    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    from _common import example_names, setup_path

    setup_path()
    for n in sys.argv[1:] or example_names():
        r = run_one(n)
        print(f"{n:20s} compiled HLO identical: {r.compiled_identical}  ({r.calls} calls)")
        for clock, t in (("wall", r.wall), ("cpu", r.cpu)):
            print(f"  {clock:4s} typed/raw {t.ratio:.3f}  typed {min(t.a) * 1e6:.0f} us  "
                  f"raw {min(t.b) * 1e6:.0f} us  {t.spread()}")
