"""Benchmark (not a test): pyright on a typed module, with the generated stub vs today's static
view (`spmdtyped/_static.py`, every result `SArray[Any, Any, Any]`).

A ~500-line module of N functions, each with state-annotated parameters and a few operator,
`st.numpy` and collective lines (nested as real code nests them), is checked by pyright once
with the package's own static view and once per vocabulary size with
`python -m spmdtyped stubgen --axes ...` in `typings/`. Wall time of a cold pyright run (JAX's
stubs are analysed in both); runs are interleaved and the minimum of the rounds is kept.

Usage: `python benchmarks/bench_pyright.py [--rounds 2] [--functions 50]`. Prints a table with
ratios (goal: at most 2.5x); asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
AXES = ("dp", "tp", "fsdp", "ep")

_FUNC = '''

def block{k}(x: Varying["dp"], w1: Varying["tp"], w2: Varying["tp"], b: Invariant,
             r: Reduced["tp"], u: Unreduced["tp"]) -> Varying["dp", "tp"]:
    h = st.numpy.tanh(x @ w1 + b)
    g = st.nn.relu(h * 2.0) - h / 3.0
    z = st.psum(g @ w2, "tp")
    s = st.psum(u, "tp") + st.pcast(r, "tp", to="varying") * 0.5
    y = st.pmean(z + b * 2.0, "dp")
    t = st.numpy.exp(-(z * z)) + s
    return st.pvary(y, "dp") + t * 0.0
'''


def module(n: int) -> str:
    head = ("from typing import Literal, TypeAlias\n\nimport spmdtyped as st\n"
            "from spmdtyped import Invariant, Reduced, Unreduced, Varying\n\n"
            + "".join(f'{a}: TypeAlias = Literal["{a}"]\n' for a in AXES))
    return head + "".join(_FUNC.format(k=k) for k in range(n))


def pyright_exe() -> str:
    exe = shutil.which("pyright", path=str(Path(sys.executable).parent)) or shutil.which("pyright")
    if exe is None:
        sys.exit("pyright is not installed (pip install pyright==1.1.414)")
    return exe


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(folder: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of one cold pyright run (CPU time is steadier on a shared machine)."""
    t, c = time.perf_counter(), _cpu()
    proc = subprocess.run([pyright_exe(), "--pythonpath", sys.executable, "module.py"],
                          cwd=folder, capture_output=True, text=True, timeout=900)
    if '"spmdtyped" could not be resolved' in proc.stdout:
        sys.exit(proc.stdout[-2000:])
    return time.perf_counter() - t, _cpu() - c


def setup(root: Path, axes: tuple[str, ...] | None, text: str) -> Path:
    folder = root / (f"stub{len(axes)}" if axes else "static")
    folder.mkdir()
    (folder / "module.py").write_text(text)
    (folder / "pyrightconfig.json").write_text(json.dumps({
        "reportDeprecated": "error", "exclude": ["typings"], "extraPaths": [str(REPO)]}))
    if axes:
        subprocess.run([sys.executable, "-m", "spmdtyped", "stubgen", "--axes", ",".join(axes),
                        "--out", str(folder / "typings")], cwd=REPO, check=True,
                       capture_output=True)
    return folder


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--functions", type=int, default=50)
    args = ap.parse_args()
    text = module(args.functions)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        configs = {"static view": setup(root, None, text)}
        for n in (2, 3, 4):
            configs[f"stub, {n} axes"] = setup(root, AXES[:n], text)
        best = {k: float("inf") for k in configs}
        cpu = {k: float("inf") for k in configs}
        for _ in range(args.rounds):
            for k, folder in configs.items():
                wall, c = run(folder)
                best[k], cpu[k] = min(best[k], wall), min(cpu[k], c)
    lines = text.count("\n")
    print(f"pyright on a {lines}-line module ({args.functions} functions), best of {args.rounds}; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    base, cbase = best["static view"], cpu["static view"]
    for k, t in best.items():
        print(f"  {k:14s} wall {t:7.2f} s  x{t / base:4.2f}   CPU {cpu[k]:7.2f} s  "
              f"x{cpu[k] / cbase:4.2f}")


if __name__ == "__main__":
    main()
