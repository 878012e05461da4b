"""`make bench`: typed vs hand-written raw shard_map, side by side in one run, one table.

Rows (each a ratio measured in this process, typed and raw interleaved):

1. lowered program identity: every example's typed and raw programs lower to the same
   StableHLO (names normalised, `benchmarks/lowering.py`; asserted by
   `tests/test_lowering_identity.py`);
2. trace + lower time of the 32-layer dp x tp transformer (`benchmarks/bench_trace.py`);
3. runtime hint check cost per argument, isinstance and beartype, typed value and raw tracer
   (`benchmarks/bench_hints.py`);
4. mypy with the spmdtyped plugin / without, on `examples/` (`benchmarks/bench_mypy.py`);
5. compiled step time of every example (`benchmarks/bench_step.py`).

Usage: `python benchmarks/run.py [--quick] [--skip-mypy] [--trace-rounds N] ...`.
Asserts nothing about time; exits non-zero only if a lowered program differs.
"""

from __future__ import annotations

import os

# 8 simulated CPU devices, before anything imports JAX
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import io  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import example_names, fmt_s, import_example, machine, setup_path  # noqa: E402

setup_path()

Row = tuple[str, str, str, str, str, str, str]  # id, measurement, typed, baseline, ratio, goal, status
HEADER: Row = ("#", "measurement", "spmdtyped", "baseline", "ratio", "goal", "status / spread")


def _section(title: str) -> None:
    print(f"\n--- {title}", flush=True)


# ---------------------------------------------------------------------------------- 1. identity


def identity_rows(names: list[str]) -> tuple[list[Row], bool]:
    from lowering import compare_example

    _section("1. lowered program identity (StableHLO, debug info and names stripped)")
    ok: list[str] = []
    bad: list[str] = []
    skipped: list[str] = []
    for name in names:
        try:
            module = import_example(name)
        except Exception as e:  # an example still being written
            skipped.append(f"{name} (import: {type(e).__name__}: {str(e).splitlines()[0]})")
            print(f"  {name:20s} SKIPPED: does not import: {e}")
            continue
        try:
            identical, diff = compare_example(module)
        except Exception as e:
            skipped.append(f"{name} (lowering: {type(e).__name__}: {str(e).splitlines()[0]})")
            print(f"  {name:20s} SKIPPED: does not lower: {type(e).__name__}: {str(e).splitlines()[0]}")
            continue
        (ok if identical else bad).append(name)
        print(f"  {name:20s} {'identical' if identical else 'DIFFERENT'}")
        if diff:
            print("\n".join("      " + line for line in diff.splitlines()[:40]))
    checked = len(ok) + len(bad)
    status = "ok" if not bad else f"DIFFERENT: {', '.join(bad)}"
    if skipped:
        status += f"; skipped {len(skipped)}: " + "; ".join(skipped)
    rows: list[Row] = [("1", f"lowered StableHLO identical ({checked} of {len(names)} examples lowered)",
                        f"{len(ok)}/{checked}", "", f"{len(ok)}/{checked}", "all identical", status)]
    return rows, not bad


# ---------------------------------------------------------------------------------- 2. trace


def trace_rows(layers: int, rounds: int, check_off_rounds: int) -> list[Row]:
    import bench_trace

    _section(f"2. trace + lower, transformer layers={layers} (dp=2 x tp=4), {rounds} rounds")
    r = bench_trace.run(layers=layers, rounds=rounds, check_off_rounds=check_off_rounds)
    c, w, off = r.cpu, r.wall, r.check_off
    print(f"  thread CPU s typed: {' '.join(f'{x:.3f}' for x in c.a)}")
    print(f"  thread CPU s raw:   {' '.join(f'{x:.3f}' for x in c.b)}")
    print(f"  wall s typed:       {' '.join(f'{x:.3f}' for x in w.a)}")
    print(f"  wall s raw:         {' '.join(f'{x:.3f}' for x in w.b)}")
    goal = "<= 1.05x"
    q = statistics.quantiles(c.round_ratios, n=4)
    if c.ratio <= 1.05:
        status = "ok"
    elif statistics.median(c.round_ratios) <= 1.05:
        status = "not resolved: min ratio > 1.05x, median round ratio <= 1.05x (noise)"
    else:
        status = "MISSED" + (" (median and lower quartile of the round ratios > 1.05x)"
                             if q[0] > 1.05 else "")
    calls, share = bench_trace.profile(layers=layers)
    print(f"  cProfile: Python calls typed/raw {calls:.3f}x; spmdtyped's own frames "
          f"{share * 100:.1f}% of the typed trace + lower")
    return [
        ("2", f"trace + lower, {layers}-layer transformer (thread CPU, min of {rounds})",
         fmt_s(min(c.a)), fmt_s(min(c.b)), f"{c.ratio:.3f}x", goal, f"{status}; {c.spread()}"),
        ("2", f"  same runs, wall clock (min of {rounds})", fmt_s(min(w.a)), fmt_s(min(w.b)),
         f"{w.ratio:.3f}x", "(reported)", w.spread()),
        ("2", f"  typed with st.check_mode(False) (thread CPU, min of {len(off.a)})",
         fmt_s(min(off.a)), fmt_s(min(off.b)), f"{off.ratio:.3f}x", "(reported)", off.spread()),
        ("2", "  same work, deterministic: Python function calls (cProfile)", "", "",
         f"{calls:.3f}x", "(reported)",
         f"spmdtyped's own frames: {share * 100:.1f}% of the profiled typed trace + lower"),
    ]


# ---------------------------------------------------------------------------------- 3. hints


def hint_rows(number: int) -> list[Row]:
    import bench_hints

    _section("3. runtime hint checks inside shard_map (4 hinted arguments per call)")
    rows: list[Row] = []
    for h in bench_hints.run(number=number):
        print(f"  {h.check:10s} {h.value:12s} {h.per_arg_us:6.2f} us/argument  call {h.call_us:6.2f} us"
              f"  unannotated {h.plain_us:5.2f} us  ({h.ratio:.1f}x)")
        what = ("isinstance(x, st.Varying['dp'])" if h.check == "isinstance"
                else "@beartype, x: st.Varying['dp']")
        rows.append(("3", f"{what}, {h.value}", f"{h.per_arg_us:.2f} us/arg",
                     f"{h.plain_us:.2f} us/call", f"{h.ratio:.1f}x call",
                     "<= 2 us/arg", "ok" if h.per_arg_us <= 2.0 else "MISSED"))
    return rows


# ---------------------------------------------------------------------------------- 4. mypy


def mypy_rows(rounds: int, functions: int) -> list[Row]:
    _section(f"4. mypy with the plugin / without (benchmarks/bench_mypy.py, best of {rounds})")
    path = HERE / "bench_mypy.py"
    if not path.exists():
        return [("4", "mypy + plugin / mypy, examples/", "", "", "n/a", "<= 1.3x",
                 "benchmarks/bench_mypy.py missing")]
    import bench_mypy

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        bench_mypy.bench_mypy(rounds, functions)
    text = out.getvalue()
    print("\n".join("  " + line for line in text.strip("\n").splitlines()))
    rows: list[Row] = []
    for label, name in (("examples/", "examples/"),
                        (f"generated module ({functions} functions), Literal spelling",
                         "generated, literal"),
                        (f"generated module ({functions} functions), bare strings + vocabulary",
                         "generated, vocab")):
        with_p = re.search(rf"^\s*{re.escape(name)}, plugin\s+([\d.]+)\s+([\d.]+)x", text, re.M)
        without = re.search(rf"^\s*{re.escape(name)}, no plugin\s+([\d.]+)", text, re.M)
        if not (with_p and without):
            rows.append(("4", f"mypy + plugin / mypy, {label}", "", "", "n/a", "<= 1.3x",
                         "could not read bench_mypy's output (printed above)"))
            continue
        ratio = float(with_p.group(2))
        goal = "<= 1.3x" if name == "examples/" else "(reported)"
        status = ("ok" if ratio <= 1.3 else "MISSED") if name == "examples/" else ""
        rows.append(("4", f"mypy + plugin / mypy, {label} (CPU, warm deps, best of {rounds})",
                     f"{float(with_p.group(1)):.2f} s", f"{float(without.group(1)):.2f} s",
                     f"{ratio:.2f}x", goal, status))
    return rows


# ---------------------------------------------------------------------------------- 5. step


def step_rows(names: list[str], rounds: int) -> list[Row]:
    import bench_step

    _section(f"5. compiled step time (wall and process CPU, min of {rounds} interleaved rounds)")
    rows: list[Row] = []
    for name in names:
        try:
            r = bench_step.run_one(name, rounds=rounds)
        except Exception as e:
            print(f"  {name:20s} SKIPPED: {type(e).__name__}: {str(e).splitlines()[0]}")
            rows.append(("5", f"step time, {name}", "", "", "n/a", "1.00x within noise",
                         f"skipped: {type(e).__name__}: {str(e).splitlines()[0]}"))
            continue
        c, w = r.cpu, r.wall
        q = statistics.quantiles(w.round_ratios, n=4)
        within = q[0] <= 1.0 <= q[2] or abs(w.ratio - 1.0) <= 0.02
        same = "compiled HLO identical" if r.compiled_identical else "COMPILED HLO DIFFERS"
        print(f"  {name:20s} cpu typed {min(c.a) * 1e6:8.1f} us  raw {min(c.b) * 1e6:8.1f} us  "
              f"{c.ratio:.3f}x | wall typed {min(w.a) * 1e6:8.1f} us  raw {min(w.b) * 1e6:8.1f} us  "
              f"{w.ratio:.3f}x  ({r.calls} call(s) per measurement; {same})")
        calls = f"{r.calls} call{'s' if r.calls != 1 else ''}"
        rows.append(("5", f"step time, {name} (wall; {calls} per measurement)",
                     fmt_s(min(w.a)), fmt_s(min(w.b)), f"{w.ratio:.3f}x", "1.00x within noise",
                     f"{'ok' if within else 'outside the quartiles'}; {same}; process CPU "
                     f"{c.ratio:.3f}x; {w.spread()}"))
    return rows


# ---------------------------------------------------------------------------------- table


def render(rows: list[Row]) -> str:
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    widths[-1] = min(widths[-1], 200)

    def line(r: Row) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(HEADER), sep, *map(line, rows)])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="few rounds (a smoke run, noisy)")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--trace-rounds", type=int, default=30)
    p.add_argument("--check-off-rounds", type=int, default=8)
    p.add_argument("--step-rounds", type=int, default=60)
    p.add_argument("--hint-calls", type=int, default=20000)
    p.add_argument("--mypy-rounds", type=int, default=3)
    p.add_argument("--mypy-functions", type=int, default=120)
    p.add_argument("--skip-mypy", action="store_true")
    p.add_argument("--only", default="", help="comma-separated sections to run: 1,2,3,4,5")
    a = p.parse_args()
    if a.quick:
        (a.trace_rounds, a.check_off_rounds, a.step_rounds, a.hint_calls,
         a.mypy_rounds) = 3, 2, 10, 5000, 1
    only = {s for s in a.only.split(",") if s}

    def want(s: str) -> bool:
        return not only or s in only

    start = time.time()
    print("spmdtyped benchmarks: typed vs hand-written raw shard_map, measured side by side")
    print("command: " + " ".join(shlex.quote(x) for x in [Path(sys.executable).name,
                                                         "benchmarks/run.py", *sys.argv[1:]]))
    print("machine:")
    for k, v in machine().items():
        print(f"  {k:8s} {v}")
    names = example_names()
    print(f"examples: {', '.join(names)}")

    rows: list[Row] = []
    identical = True
    sections = [
        ("1", lambda: identity_rows(names)),
        ("2", lambda: (trace_rows(a.layers, a.trace_rounds, a.check_off_rounds), True)),
        ("3", lambda: (hint_rows(a.hint_calls), True)),
        ("4", lambda: (mypy_rows(a.mypy_rounds, a.mypy_functions), True)),
        ("5", lambda: (step_rows(names, a.step_rounds), True)),
    ]
    for sid, fn in sections:
        if not want(sid) or (sid == "4" and a.skip_mypy):
            continue
        try:
            new, ok = fn()
        except Exception:
            traceback.print_exc()
            new, ok = [(sid, f"section {sid} failed (traceback above)", "", "", "n/a", "", "ERROR")], True
        rows.extend(new)
        identical = identical and ok

    print(f"\n=== results ({time.time() - start:.0f} s; load average now "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores) ===\n")
    print(render(rows))
    print("\nspmdtyped / baseline: typed / raw program (rows 1, 2, 5), mypy with / without the "
          "plugin (row 4),\nchecked / unannotated call (row 3). Times: minimum of interleaved "
          "rounds; 'round ratios' = spmdtyped/baseline\nof each round (median [quartiles]); "
          "max/min = the spread of each variant over its rounds.")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
