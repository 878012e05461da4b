"""`st.report` at the scale users deploy: a data x fsdp x tp step on an `AbstractMesh` this
machine cannot hold (64 x 8 x 8), from shapes only; on 8 devices the abstract report equals the
compiled one. And `python -m spmdtyped report FILE[:FUNC]`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import _report_programs as rp
import jax
import pytest

import spmdtyped as st
from spmdtyped._cli import report as cli

ROOT = Path(__file__).resolve().parents[1]
AXES = ("data", "fsdp", "tp")


def _expected(sizes: dict[str, int], batch: int = 128, d: int = 64, h: int = 128
              ) -> dict[tuple[Any, ...], tuple[int, int]]:
    """The 3-D step's collectives by hand: forward all-gathers of both weights over fsdp,
    the activation psum over tp; backward: the gathers' transposes (reduce-scatters over
    fsdp), the transpose of the implicit pvary over data of the *gathered* weight in `x @ a`
    (a psum over data at the gathered size, before the reduce-scatter: fsdp times the bytes
    of a shard's gradient), the psum's transpose (nothing), the loss pmean."""
    f, t, dd = sizes["fsdp"], sizes["tp"], sizes["data"]
    local_b = batch // (dd * f)
    w1_gathered = d * (h // t) * 4          # (d, h/tp) after the fsdp gather
    w_shard = (d // f) * (h // t) * 4
    return {
        ("all-gather", ("fsdp",)): (2, 2 * w1_gathered),
        ("all-reduce", ("tp",)): (1, local_b * d * 4),
        ("reduce-scatter", ("fsdp",)): (2, 2 * w_shard),
        ("all-reduce", ("data",)): (2, 2 * w1_gathered),
        ("all-reduce", ("data", "fsdp")): (1, 4),
    }


def test_abstract_mesh_report_from_shapes_only() -> None:
    mesh = jax.sharding.AbstractMesh((64, 8, 8), AXES)
    rep = st.report(*_flat(rp.three_d(mesh, batch=64 * 8 * 4, d=512, h=1024)))
    assert not rep.was_compiled and rep.compiled == []
    assert rep.mesh == {"data": 64, "fsdp": 8, "tp": 8}
    got = rep.summary()
    assert got == _expected(rep.mesh, batch=64 * 8 * 4, d=512, h=1024), got
    # SPMD705: the psums over data of both weights run at their gathered size, fsdp times the
    # parameter bytes replicated over data (the fix: pvary the shard before the gather)
    (flag,) = rep.flags
    assert (flag.code, flag.axes) == ("SPMD705", ("data",))
    assert f"{rep.mesh['fsdp']:.2f}x the ideal" in flag.message and "2 reductions" in flag.message
    assert "before gathering" in flag.fix
    totals = rep.totals()["axes"]
    assert totals["fsdp"] == 2 * 512 * 128 * 4 + 2 * 64 * 128 * 4


def test_abstract_report_equals_compiled_on_8_devices() -> None:
    concrete = jax.make_mesh((2, 2, 2), AXES)
    abstract = jax.sharding.AbstractMesh((2, 2, 2), AXES)
    compiled = st.report(*_flat(rp.three_d(concrete)))
    shapes = st.report(*_flat(rp.three_d(abstract)))
    assert compiled.was_compiled and not shapes.was_compiled
    assert shapes.summary() == compiled.summary() == compiled.summary("compiled")
    assert shapes.summary() == _expected(compiled.mesh)
    strip = lambda r: [{k: v for k, v in c.items() if k != "where"}  # noqa: E731
                       for c in r.to_json()["collectives"]]
    assert strip(shapes) == strip(compiled)


def _flat(made: tuple[Any, tuple[Any, ...]]) -> tuple[Any, ...]:
    return (made[0], *made[1])


# ------------------------------------------------------------- CLI


def test_cli_reports_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([str(ROOT / "examples" / "megatron_mlp.py")]) == 0
    out = capsys.readouterr().out
    assert "axes tp: 256 B" in out and "megatron_mlp.py:37" in out


def test_cli_func_json_and_flags_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    src = tmp_path / "accum.py"
    src.write_text(f"import sys\nsys.path.insert(0, {str(ROOT / 'tests')!r})\n"
                   "import _report_programs as rp\n\n\n"
                   "def bad():\n    return rp.accumulation('per_micro')\n")
    page = tmp_path / "r.html"
    assert cli.main([f"{src}:bad", "--json", "--html", str(page)]) == 1
    out = json.loads(capsys.readouterr().out)
    assert [f["code"] for f in out["flags"]] == ["SPMD701", "SPMD705"]
    assert page.read_text().startswith("<!doctype html>")


def test_cli_is_a_subcommand() -> None:
    from spmdtyped import _cli

    assert _cli._COMMANDS["report"][0] == "spmdtyped._cli.report"
    assert cli.main(["/no/such/file.py"]) == 2
    assert "spmdtyped._cli.report" in sys.modules


def test_cli_progress_flag(capsys: pytest.CaptureFixture[str]) -> None:
    example = str(ROOT / "examples" / "megatron_mlp.py")
    assert cli.main([example, "--json"]) == 0
    quiet = capsys.readouterr()
    assert quiet.err == ""                              # not a terminal: off by default
    assert cli.main([example, "--json", "--progress"]) == 0
    loud = capsys.readouterr()
    assert json.loads(loud.out) == json.loads(quiet.out)
    assert "] compile:" in loud.err and "] parse HLO: 1 collectives" in loud.err
    assert cli.main([example, "--json", "--no-progress"]) == 0
    assert capsys.readouterr().err == ""
