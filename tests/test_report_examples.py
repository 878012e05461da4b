"""`st.report` on every example: the collectives of the jaxpr (kind, axes, count, bytes) equal
what the compiled program runs, with the compiler's differences named; typed and raw
shard_map steps have the same report; the JSON interface; the table and the HTML page."""

from __future__ import annotations

import functools
import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

import spmdtyped as st

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: every example with a `programs(mesh)` step (equinox/flax ones need their libraries)
EXAMPLES = ["collective_matmul", "data_parallel", "megatron_mlp", "moe", "pipeline",
            "ring_attention", "sequence_parallel", "transformer", "zero3"]
#: what XLA does to each example's collectives: it merges all-reduces into tuple ops (the
#: all-reduce combiner); counts and bytes per operand stay the same
COMBINED = {"data_parallel", "transformer", "moe"}


@functools.cache
def _example(name: str) -> tuple[Any, tuple[Any, ...], Any]:
    m = importlib.import_module(f"examples.{name}")
    mesh = m.make_mesh()
    return m.programs(mesh), tuple(m.make_inputs(mesh)), mesh


@functools.cache
def _report(name: str, which: int = 0) -> Any:
    """One report per example program (each compiles it), shared by the tests below."""
    progs, args, _ = _example(name)
    return st.report(progs[which], *args)


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_traced_equals_compiled(name: str) -> None:
    rep = _report(name)
    assert rep.was_compiled and rep.collectives
    # kind, axes, count, bytes: the jaxpr's account is what runs
    assert rep.summary() == rep.summary("compiled")
    assert rep.removed == [] and rep.added() == []
    assert all(op.origin in ("user", "autodiff", "jax") for op in rep.compiled)
    assert any("combined by the compiler" in d for d in rep.differences()) == (name in COMBINED)
    assert all(c.where and c.where.split(":")[0].endswith(f"{name}.py")
               for c in rep.collectives), [c.where for c in rep.collectives]


@pytest.mark.parametrize("name", ["data_parallel", "megatron_mlp", "zero3"])
def test_typed_and_raw_shard_map_have_the_same_report(name: str) -> None:
    typed, raw = _report(name, 0), _report(name, 1)

    def strip(rep: Any) -> list[dict[str, Any]]:
        return [{k: v for k, v in c.items() if k != "where"} for c in rep.to_json()["collectives"]]

    assert strip(typed) == strip(raw)
    assert typed.to_json()["compiled"] == raw.to_json()["compiled"]


def test_data_parallel_backward_is_autodiff_at_the_users_line() -> None:
    rep = _report("data_parallel")
    from examples import data_parallel

    fwd = [c for c in rep.collectives if c.phase == "forward"]
    bwd = [c for c in rep.collectives if c.phase == "backward"]
    line = data_parallel.loss_fn.__code__.co_firstlineno
    # pmean of the loss: the user's; the gradient psums: transposes of the implicit pvarys of
    # w and b in `x @ w + b` (the line above the pmean)
    assert [(c.origin, c.where.rsplit(":", 1)[1]) for c in fwd] == [("user", str(line + 2))]
    assert {(c.origin, c.where.rsplit(":", 1)[1]) for c in bwd} == {("autodiff", str(line + 1))}
    assert sum(c.bytes for c in bwd) == 4 * (8 + 1)   # gw f32[8] + gb f32[]
    assert rep.flags == []


def test_to_json_is_the_interface() -> None:
    out = _report("megatron_mlp").to_json()
    assert set(out) == {"collectives", "compiled", "flags"}
    c, = out["collectives"]
    assert c == {"kind": "all-reduce", "axes": ["tp"], "count": 1, "bytes": 256,
                 "phase": "forward", "origin": "user", "where": c["where"]}
    assert c["where"].endswith("megatron_mlp.py:37")
    assert out["compiled"] == [{"kind": "all-reduce", "axes": ["tp"], "count": 1, "bytes": 256,
                                "origin": "user"}]
    assert out["flags"] == []


def test_table_groups_by_axes_sorted_by_bytes_and_html_is_self_contained() -> None:
    rep = _report("transformer")
    text = rep.table()
    assert text.index("axes tp: 36.0 KiB") < text.index("axes dp: 24.0 KiB")
    block = text.split("axes tp:")[1].split("axes dp:")[0]
    sizes = [float(line.split()[4]) for line in block.splitlines()[2:] if line.strip()]
    assert sizes == sorted(sizes, reverse=True)
    page = rep.html()
    assert page.startswith("<!doctype html>") and "<script" not in page and "http" not in page
    assert rep.totals() == rep.totals("compiled")
    assert rep.totals()["axes"] == {"tp": 36864, "dp": 24580}
