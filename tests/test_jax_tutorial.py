"""JAX's own shard_map tutorial (`jax_suite/tutorial.py`: JAX's `docs/new_docs/201/shard-map.md`
at cec06d1, vendored unchanged) run as JAX wrote it, with `jax.shard_map` spelled
`typed_shard_map`, and as the codemod ports it, cell by cell, in one process per flavor: every
cell prints what it prints raw, or is a row of `KNOWN`, and none raises what raw does not.
Slow (about 75 s of CPU).

The tutorial is the code a new user copies first: eager calls under `jax.set_mesh`, decorators
with the mesh from context, `jax.typeof` / `jax.make_jaxpr` printed from bodies, the collective
matmul, FSDP, tensor parallelism and a pipeline. What differs, by kind:
- "traced": called eagerly, `typed_shard_map` traces the body once to check it before it runs
  (docs/porting.md): the body's own `print`s run once more, first, on abstract values. Every
  cell but those printing from an eager body prints exactly what raw JAX prints, jaxprs included.
- "caught": the cell catches JAX's error and prints it; typed prints spmdtyped's, with the
  code. Cell 22 (a loop carry swapped, called with an unsharded `x`) fails JAX's in_specs check
  first, and typed reports that (SPMD403) rather than the carry (SPMD302) as JAX does.
- "strict": the tutorial computes per device on purpose (a replicated `y` as long as `x`'s
  shard, multiplied elementwise: documented on docs/refinement.md); under `st.allow` of its code
  it prints what raw JAX prints.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
from jax_suite import tutorial

ROOT = pathlib.Path(__file__).parents[1]

#: cell index -> (kind, code): see the module docstring
KNOWN: dict[int, tuple[str, str]] = {
    19: ("caught", "SPMD401"),   # out_specs=P() of a value varying over 'i', caught and printed
    21: ("strict", "SPMD215"),   # x * y: x sharded over 'i', y replicated and as long as x's shard
    22: ("caught", "SPMD403"),   # the swapped scan carry, x not sharded as its in_spec says
}

#: what a body prints on the check's trace (`jax.typeof`, a tracer, a shape) and the labels
#: a cell prints beside them
_ABSTRACT = re.compile(r"Tracer\(|^\s*[a-z]+\d*\[[\d,]*\](\{.*\})?$|^\(\d+(, \d+)*,?\)$")


def _flavor(flavor: str, tmp: pathlib.Path) -> list[dict[str, object]]:
    out = tmp / f"{flavor}.json"
    allow = [f"{i}={code}" for i, (kind, code) in KNOWN.items() if kind == "strict"] \
        if flavor != "raw" else []
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
           "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "jax_suite" / "tutorial.py"),
                           flavor, str(out), *allow],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def traced_only(raw: str, typed: str) -> bool:
    """Whether `typed` is `raw` with lines added that a body prints while it is traced: raw's
    lines in order, each added line an abstract value or a label raw prints too."""
    lines = iter(typed.splitlines())
    added: list[str] = []
    for want in raw.splitlines():
        for line in lines:
            if line == want:
                break
            added.append(line)
        else:
            return False
    added.extend(lines)
    labels = set(raw.splitlines())
    return bool(added) and all(_ABSTRACT.search(a) or a in labels for a in added)


def classify(raw: list[dict[str, object]], typed: list[dict[str, object]]
             ) -> dict[str, list[int]]:
    got: dict[str, list[int]] = {k: [] for k in ("passed", "traced", "caught", "strict",
                                                 "failing_raw", "differs")}
    for i, (r, t) in enumerate(zip(raw, typed, strict=True)):
        kind, code = KNOWN.get(i, (None, None))
        if r["error"]:
            got["failing_raw"].append(i)
        elif kind == "caught" and not t["error"] and f"[{code}]" in str(t["out"]):
            got["caught"].append(i)
        elif kind == "strict" and f"[{code}]" in str(t["error"]) and "allowed" in t:
            allowed = t["allowed"]
            same = not allowed["error"] and (allowed["out"] == r["out"]  # type: ignore[index]
                                             or traced_only(str(r["out"]), str(allowed["out"])))  # type: ignore[index]
            got["strict" if same else "differs"].append(i)
        elif t["error"]:
            got["differs"].append(i)
        elif t["out"] == r["out"]:
            got["passed"].append(i)
        elif traced_only(str(r["out"]), str(t["out"])):
            got["traced"].append(i)
        else:
            got["differs"].append(i)
    return got


def test_traced_only_reads_added_abstract_lines() -> None:
    raw = "BEFORE:\n[0 1]\nAFTER:\n[1 2]\n"
    assert traced_only(raw, "BEFORE:\n JitTracer(int32[2]{V:i})\nAFTER:\n JitTracer(int32[2])\n" + raw)
    assert traced_only("(3, 12)\n", "(3, 12)\n(3, 12)\n")
    assert not traced_only(raw, raw)                       # nothing added
    assert not traced_only(raw, raw.replace("[1 2]", "[1 3]"))   # a value differs
    assert not traced_only(raw, raw + "[9 9]\n")           # a concrete line added
    assert not traced_only(raw, "AFTER:\n[1 2]\nBEFORE:\n[0 1]\n")   # reordered


def test_cells_spell_typed_shard_map() -> None:
    cells = tutorial.cells()
    assert len(cells) == 70   # the vendored file, unchanged
    typed = [tutorial.typed_source(c) for c in cells]
    assert sum(c.count("typed_shard_map") for c in typed) == sum(
        c.count("jax.shard_map") for c in cells) > 30
    assert not any("jax.shard_map" in c for c in typed)


def test_the_codemod_ports_most_cells() -> None:
    cells = tutorial.cells()
    ported = [tutorial.ported_source(c) for c in cells]
    changed = [p for p, c in zip(ported, cells, strict=True) if p != c]
    assert len(changed) >= 35   # the transform, collectives, annotations
    assert sum("Varying[" in p for p in changed) >= 15
    assert not any("jax.shard_map" in p for p in ported)


@pytest.fixture(scope="module")
def raw_run(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, object]]:
    return _flavor("raw", tmp_path_factory.mktemp("raw"))


@pytest.mark.xdist_group("jax_tutorial")
@pytest.mark.parametrize("flavor", ["typed", "ported"])
def test_jax_tutorial_through_typed_shard_map(raw_run: list[dict[str, object]], flavor: str,
                                              tmp_path: pathlib.Path) -> None:
    raw, typed = raw_run, _flavor(flavor, tmp_path)
    got = classify(raw, typed)
    print(f"\nJAX's shard_map tutorial, {flavor}:",
          ", ".join(f"{k} {len(v)}" for k, v in got.items()), f"(of {len(raw)} cells)")
    assert not got["differs"], [(i, raw[i], typed[i]) for i in got["differs"]]
    assert not got["failing_raw"], [(i, raw[i]["error"]) for i in got["failing_raw"]]
    stale = [i for i, (kind, _) in KNOWN.items() if i not in got[kind]]
    assert not stale, f"KNOWN rows that no longer hold: {stale}"
    # nearly every cell is compared: the collective matmul, FSDP, TP and pipeline ones too
    assert len(got["passed"]) + len(got["traced"]) >= 60
