"""Benchmark (not a test): the cost of static and call-time checking.

1. **mypy with the plugin vs without**, on `examples/*.py` and on a generated module (N
   functions, each with state-annotated parameters and collective/operator lines), in three
   spellings: `Varying[Literal["dp"]]`, bare strings with an axis vocabulary, bare strings
   alone (plugin only). CPU time (user + sys) of a mypy run that re-checks the target files
   while JAX's and numpy's stubs come from a warm cache (what a user's edit-check loop costs);
   runs are interleaved round-robin and the minimum of the rounds is kept (2-core VM noise).
   Every run is timed twice: with Python's bytecode cache (an installed package, which pip
   byte-compiles) and without (`PYTHONDONTWRITEBYTECODE=1`: the plugin compiled on every run).
2. **beartype per argument**: a function with k state-annotated arguments, `@beartype` vs
   undecorated, on typed values (the exact state class: one class test), an Invariant value
   where `Varying` is expected (the covariant `__instancecheck__`), and raw JAX arrays (state
   read with `jax.typeof`).

Usage: `python benchmarks/bench_mypy.py [--rounds 3] [--functions 120] [--skip-mypy]`.
Prints tables with ratios; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------------------- mypy


def _config(tmp: Path, plugin: bool) -> Path:
    cfg = tmp / ("plugin.ini" if plugin else "plain.ini")
    cfg.write_text("[mypy]\n" + ("plugins = spmdtyped.mypy_plugin\n" if plugin else "")
                   + f"mypy_path = {REPO}\n[mypy-spmdtyped.*]\nignore_errors = True\n")
    return cfg


def _import_only_config(tmp: Path) -> Path:
    """A configuration whose plugin imports `spmdtyped.mypy_plugin` and registers no hook: its
    difference to plain mypy is the plugin's import (compiling its source without `.pyc`)."""
    (tmp / "import_only.py").write_text(
        "import spmdtyped.mypy_plugin  # noqa: F401\nfrom mypy.plugin import Plugin\n\n\n"
        "def plugin(version):\n    return Plugin\n")
    cfg = tmp / "import_only.ini"
    cfg.write_text(f"[mypy]\nplugins = {tmp / 'import_only.py'}\nmypy_path = {REPO}\n"
                   "[mypy-spmdtyped.*]\nignore_errors = True\n")
    return cfg


def _generated(n: int, spelling: str) -> str:
    """A module of `n` functions in one hint spelling."""
    if spelling == "literal":
        head = "from typing import Literal\n"
        ax = {"dp": 'Literal["dp"]', "tp": 'Literal["tp"]', "dptp": 'Literal["dp", "tp"]'}
    else:
        head = ("from typing import Literal, TypeAlias\n\ndp: TypeAlias = Literal['dp']\n"
                "tp: TypeAlias = Literal['tp']\n" if spelling == "vocab" else "")
        ax = {"dp": '"dp"', "tp": '"tp"', "dptp": '"dp | tp"'}
    out = [head, "import spmdtyped as st", "from spmdtyped import Invariant, Reduced, Varying", ""]
    for i in range(n):
        out.append(f"""
def layer_{i}(x: Varying[{ax['dp']}], w: Varying[{ax['tp']}], b: Invariant,
              r: Reduced[{ax['tp']}]) -> Varying[{ax['dp']}]:
    h: Varying[{ax['dptp']}] = x @ w + b
    h = h * 2.0 - b
    u = st.pcast(h, "tp", to="unreduced").sum(axis=0)
    s = st.psum(u, "tp")
    g = st.all_gather(st.pcast(r, "tp", to="varying"), "tp", tiled=True)
    y = st.psum(h + s + (g * 0.0).sum(), "tp")
    z = st.ppermute(y, "dp", [(0, 1), (1, 0)])
    return {f"layer_{i - 1}(z, w, b, r)" if i else "z"}
""")
    return "\n".join(out)


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _env(src: Path, bytecode: bool) -> dict[str, str]:
    """The environment of a mypy run whose plugin is imported from a copy of the package in
    `src` (never the checkout, whose `__pycache__` may hold anything): with Python's bytecode
    cache written and read there (`bytecode`: an installed package, which pip byte-compiles),
    or with `PYTHONDONTWRITEBYTECODE=1` (the plugin compiled from source on every run)."""
    shutil.copytree(REPO / "spmdtyped", src / "spmdtyped",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, PYTHONPATH=str(src))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if not bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _mypy_cpu(files: list[Path], cfg: Path, cache: Path, cwd: Path, salt: int,
              env: dict[str, str]) -> float:
    # a changed comment forces mypy to re-check the targets; dependencies stay cached. mypy
    # trusts an unchanged (whole-second) mtime and size, so the mtime is set to one per salt
    for f in files:
        text = f.read_text().split("\n# bench salt")[0]
        f.write_text(text + f"\n# bench salt {salt}\n")
        os.utime(f, (1_700_000_000 + salt, 1_700_000_000 + salt))
    before = _cpu()
    subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(cfg), "--cache-dir",
                    str(cache), "--explicit-package-bases", *map(str, files)], cwd=cwd, env=env,
                   capture_output=True, text=True)
    return _cpu() - before


def bench_mypy(rounds: int, n_functions: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="spmdtyped-bench-"))
    plugin, plain = _config(tmp, True), _config(tmp, False)
    ex = tmp / "ex"
    shutil.copytree(REPO / "examples", ex / "examples")
    ex_files = sorted((ex / "examples").glob("*.py"))
    gen = tmp / "gen"
    gen.mkdir()
    variants: dict[str, tuple[list[Path], Path, Path]] = {}
    for spelling in ("literal", "vocab", "bare"):
        f = gen / f"{spelling}.py"
        f.write_text(_generated(n_functions, spelling))
        variants[f"generated, {spelling}, no plugin"] = ([f], plain, gen)
        variants[f"generated, {spelling}, plugin"] = ([f], plugin, gen)
        if spelling == "literal":  # the plugin's import alone (the rest is its hooks)
            variants["generated, literal, plugin import only"] = ([f], _import_only_config(tmp), gen)
    variants["examples/, no plugin"] = (ex_files, plain, ex)
    variants["examples/, plugin"] = (ex_files, plugin, ex)
    # one cache per configuration (module names do not collide); warm it first, so that JAX's
    # and numpy's stubs are loaded from it in the timed runs
    caches = {name: tmp / f"cache-{cfg.stem}" for name, (_, cfg, _) in variants.items()}
    envs = {True: _env(tmp / "src-pyc", True), False: _env(tmp / "src-no-pyc", False)}
    for name, (files, cfg, cwd) in variants.items():
        _mypy_cpu(files, cfg, caches[name], cwd, -1, envs[True])
    best: dict[tuple[str, bool], float] = {}
    for r in range(rounds):
        for name, (files, cfg, cwd) in variants.items():
            for bytecode, env in envs.items():
                # a new salt for every run: each one re-checks the targets
                t = _mypy_cpu(files, cfg, caches[name], cwd, 2 * r + bytecode, env)
                best[name, bytecode] = min(best.get((name, bytecode), t), t)
    lines = sum(len(f.read_text().splitlines()) for f in ex_files)
    print(f"\nmypy CPU time, re-checking the targets (dependencies cached), best of {rounds}")
    print(f"  generated module: {n_functions} functions; examples/: {len(ex_files)} files, "
          f"{lines} lines")
    print("  .pyc: the plugin's bytecode cached (an installed package); no .pyc:")
    print("  PYTHONDONTWRITEBYTECODE=1 (the plugin compiled from source on every run)\n")
    print(f"  {'variant':42s} {'.pyc CPU s':>10s} {'vs no plugin':>13s} {'no .pyc CPU s':>14s} "
          f"{'vs no plugin':>13s}")
    for name in variants:
        base_name = name.replace(", plugin", ", no plugin").removesuffix(" import only")
        cells = []
        for bytecode in (True, False):
            t = best[name, bytecode]
            cells.append(f"{t:{10 if bytecode else 14}.2f} {t / best[base_name, bytecode]:12.2f}x")
        print(f"  {name:42s} {' '.join(cells)}")
    for bytecode in (True, False):
        ref = best["generated, literal, no plugin", bytecode]
        label = ".pyc" if bytecode else "no .pyc"
        print(f"\n  {label}: generated, bare strings + plugin vs Literal spelling without plugin: "
              f"{best['generated, bare, plugin', bytecode] / ref:.2f}x; vocabulary + plugin: "
              f"{best['generated, vocab, plugin', bytecode] / ref:.2f}x")
    shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------------------- beartype


def bench_beartype(number: int) -> None:
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    import jax.numpy as jnp
    from beartype import beartype

    sys.path.insert(0, str(REPO))
    import spmdtyped as st
    from spmdtyped import Invariant, Varying

    raw = jnp.ones(4)
    exact = Varying["dp"](raw)      # a typed value whose class is the hint: one class test
    invariant = st.wrap(raw)        # Invariant, checked against Varying: covariant path

    def plain(a, b, c, d):  # noqa: ANN001, ANN202
        return a

    @beartype
    def one(a: Varying["dp"], b, c, d):  # noqa: ANN001, ANN202
        return a

    @beartype
    def four(a: Varying["dp"], b: Varying["dp"], c: Varying["dp"], d: Varying["dp"]):  # noqa: ANN202
        return a

    @beartype
    def four_invariant_hint(a: Invariant, b: Invariant, c: Invariant, d: Invariant):  # noqa: ANN202
        return a

    @beartype
    def four_int(a: int, b: int, c: int, d: int):  # noqa: ANN202
        return a

    def best(stmt: object) -> float:
        return min(timeit.repeat(stmt, number=number, repeat=5)) / number * 1e9  # type: ignore[arg-type]

    base = best(lambda: plain(exact, exact, exact, exact))
    rows = [
        ("undecorated, 4 arguments", base),
        ("@beartype, 4 x int", best(lambda: four_int(1, 2, 3, 4))),
        ("@beartype, 1 state hint, exact class", best(lambda: one(exact, 1, 2, 3))),
        ("@beartype, 4 state hints, exact class", best(lambda: four(exact, exact, exact, exact))),
        ("@beartype, 4 hints, Invariant value vs Varying", best(
            lambda: four(invariant, invariant, invariant, invariant))),
        ("@beartype, 4 Invariant hints, raw jax.Array", best(
            lambda: four_invariant_hint(raw, raw, raw, raw))),
    ]
    print(f"\nbeartype call overhead (ns per call, best of 5 x {number})\n")
    print(f"  {'call':48s} {'ns':>8s} {'vs undecorated':>15s} {'overhead / arg':>15s}")
    for name, ns in rows:
        # beartype's wrapper plus the checks, spread over the 4 arguments
        per_arg = f"{(ns - base) / 4:.0f} ns" if name.startswith("@beartype, 4") else ""
        print(f"  {name:48s} {ns:8.0f} {ns / base:14.1f}x {per_arg:>15s}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--functions", type=int, default=120)
    p.add_argument("--number", type=int, default=20000, help="beartype calls per timing")
    p.add_argument("--skip-mypy", action="store_true")
    p.add_argument("--skip-beartype", action="store_true")
    args = p.parse_args()
    if not args.skip_mypy:
        bench_mypy(args.rounds, args.functions)
    if not args.skip_beartype:
        bench_beartype(args.number)


if __name__ == "__main__":
    main()
