"""One engine (issue 27), on the differential suite's programs: random raw JAX programs
(`_programs.render_source(..., "raw")`: `jax.lax` / `jax.numpy` bodies, some with a mistake,
some with a wrong out_spec) get the same verdict from `infer` and from `typed_shard_map`: the
first violation infer lists is the error typed_shard_map raises (code and line), and a program
infer accepts traces under typed_shard_map. Programs JAX itself refuses for another reason (a
shape error) are left out of the comparison, and counted."""

from __future__ import annotations

import importlib.util
import pathlib
from typing import Any

import _programs as pg
import jax
import pytest
from hypothesis import HealthCheck, given, settings
from test_differential import FEATURES

import spmdtyped as st

SEEN: dict[str, int] = {"programs": 0, "agree": 0, "violations": 0, "jax_other": 0}


def _module(program: pg.Program, path: pathlib.Path) -> Any:
    """The raw program as a module: `program` the raw body (the decorator line becomes `SPECS`:
    the same mesh and specs), `args` its abstract inputs."""
    lines = pg.render_source(program, "raw", trace=False).splitlines()
    for i, line in enumerate(lines):
        if line.startswith("@jax.shard_map("):
            lines[i] = "SPECS = dict(" + line[len("@jax.shard_map("):]
    path.write_text("\n".join(lines) + "\n")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _infer(mod: Any) -> tuple[str, int | None] | None:
    rep = st.adapters.infer(mod.program, *mod.args, **mod.SPECS)
    return (rep.violations[0].code, rep.violations[0].line) if rep.violations else None


def _typed(mod: Any) -> tuple[str, int | None] | None:
    try:
        jax.jit(st.adapters.typed_shard_map(mod.program, **mod.SPECS)).trace(*mod.args)
    except st.SpmdTypeError as e:
        return e.code, getattr(e, "line", None)
    return None


def _raw_jax_fails_otherwise(mod: Any) -> bool:
    """JAX refuses the program for a reason that is not a manual-axis type (no verdict)."""
    from spmdtyped._errors import jax_messages

    try:
        jax.jit(jax.shard_map(mod.program, **mod.SPECS)).trace(*mod.args)
    except Exception as e:  # noqa: BLE001 - any failure of JAX's
        return jax_messages.translate(e, "raw") is None
    return False


def test_infer_and_typed_shard_map_agree_on_random_raw_programs(tmp_path: pathlib.Path) -> None:
    disagree: list[str] = []

    @settings(max_examples=150, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(pg.programs(features=FEATURES))
    def check(program: pg.Program) -> None:
        SEEN["programs"] += 1
        mod = _module(program, tmp_path / f"prog{SEEN['programs']}.py")
        if _raw_jax_fails_otherwise(mod):
            SEEN["jax_other"] += 1
            return
        want, got = _infer(mod), _typed(mod)
        SEEN["violations"] += want is not None
        if want == got:
            SEEN["agree"] += 1
        else:
            disagree.append(f"infer {want} vs typed_shard_map {got}:\n{pg.describe(program)}")

    check()
    print(f"\nparity on random raw programs: {SEEN}")
    assert SEEN["violations"] > 0 and SEEN["agree"] > SEEN["violations"]  # both kinds seen
    assert not disagree, "\n\n".join(disagree[:3])


if __name__ == "__main__":
    pytest.main([__file__, "-q", "-s"])
