"""Shared helpers of the benchmarks: paths, the example list, the machine, interleaved timing.

Timing on a shared 2-core VM is noisy, so every comparison here is measured side by side in
one process: the two variants alternate (A B, B A, A B, ...), each measurement starts after a
`gc.collect()`, and the summary keeps the minimum of each (the least disturbed run) together
with the spread (median and max over min, and the per-round ratios).
"""

from __future__ import annotations

import gc
import importlib
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

#: examples with a multi-process launcher instead of `programs(mesh)`
_NOT_PROGRAMS = {"multiprocess"}


def setup_path() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def example_names() -> list[str]:
    """Every example module that defines `programs(mesh)` (found without importing it)."""
    return sorted(p.stem for p in EXAMPLES.glob("*.py")
                  if not p.stem.startswith("_") and p.stem not in _NOT_PROGRAMS
                  and "\ndef programs(" in p.read_text())


def import_example(name: str) -> ModuleType:
    setup_path()
    return importlib.import_module(f"examples.{name}")


# ------------------------------------------------------------------------------ the machine


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, str]:
    """CPU model, cores, load, OS, Python, and the versions of the tools measured."""
    import jax

    info = {
        "cpu": cpu_model(),
        "cores": f"{os.cpu_count()} logical",
        "python": f"{platform.python_version()} ({platform.python_implementation()})",
        "jax": f"{jax.__version__} (jaxlib {getattr(jax.lib, '__version__', '?')}), "
               f"{jax.device_count()} {jax.default_backend()} devices",
        "os": f"{platform.system()} {platform.release()}",
    }
    try:
        load = os.getloadavg()
        info["load"] = f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1/5/15 min)"
    except OSError:
        pass
    for mod in ("mypy.version", "beartype"):
        try:
            m = importlib.import_module(mod)
            info[mod.split(".")[0]] = str(getattr(m, "__version__", "?"))
        except ImportError:
            info[mod.split(".")[0]] = "not installed"
    return info


# ------------------------------------------------------------------------------ timing


@dataclass
class Timings:
    """Per-round seconds of two variants measured alternately."""

    a: list[float]
    b: list[float]

    @property
    def ratio(self) -> float:
        """min(a) / min(b): the least disturbed run of each."""
        return min(self.a) / min(self.b)

    @property
    def round_ratios(self) -> list[float]:
        return [x / y for x, y in zip(self.a, self.b, strict=True)]

    def spread(self) -> str:
        """How noisy the rounds were: median round ratio, its quartiles, and max/min of each."""
        rr = sorted(self.round_ratios)
        q = statistics.quantiles(rr, n=4) if len(rr) >= 2 else [rr[0]] * 3
        return (f"round ratios median {statistics.median(rr):.3f} [q1 {q[0]:.3f}, q3 {q[2]:.3f}]; "
                f"max/min typed {max(self.a) / min(self.a):.2f}, raw {max(self.b) / min(self.b):.2f}")


def interleaved(a: Callable[[Any], Any], b: Callable[[Any], Any], rounds: int, *,
                cpu_clock: Callable[[], float] = time.process_time,
                prepare: Callable[[int], Any] = lambda which: None) -> tuple[Timings, Timings]:
    """Time `a(prepare(0))` and `b(prepare(1))` alternately (a b, b a, a b, ...).

    Returns (wall, cpu) timings of the same runs: wall is `time.perf_counter`, cpu is
    `cpu_clock` (`time.process_time`: all threads of this process; `time.thread_time` for
    work done on the calling thread only). CPU time does not count the time the VM gives to
    other processes, so it is the steadier of the two on a shared machine.

    `prepare` runs untimed before each measurement, e.g. to build a fresh program that no
    cache has seen; a `gc.collect()` follows it so no variant pays for the other's garbage.
    """
    wall: tuple[list[float], list[float]] = ([], [])
    cpu: tuple[list[float], list[float]] = ([], [])
    for r in range(rounds):
        for which in ((0, 1) if r % 2 == 0 else (1, 0)):
            arg = prepare(which)
            fn = a if which == 0 else b
            gc.collect()
            w0, c0 = time.perf_counter(), cpu_clock()
            fn(arg)
            c1, w1 = cpu_clock(), time.perf_counter()
            wall[which].append(w1 - w0)
            cpu[which].append(c1 - c0)
    return Timings(*wall), Timings(*cpu)


def fmt_s(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"
