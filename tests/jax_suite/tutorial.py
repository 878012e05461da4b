"""JAX's shard_map tutorial (`jax_main_cec06d1_shard_map_tutorial.md`: JAX's
`docs/new_docs/201/shard-map.md` at cec06d1, unchanged, Apache-2.0 as its `LICENSE` beside it)
run cell by cell, as JAX wrote it ("raw"), with `jax.shard_map` spelled
`st.adapters.typed_shard_map` ("typed": nothing else changes), or as spmdtyped's codemod ports
each cell ("ported": `port_source`, the static port of `python -m spmdtyped port`: the
transform, `jax.lax` collectives to `st.*`, the functions annotated with the states their
literal specs give).

`python tests/jax_suite/tutorial.py raw|typed|ported OUT.json [CELL=CODE ...]` executes the code cells
in order in one namespace, as a notebook does, and writes per cell what it printed and what it
raised (`{"out": ..., "error": ...}`; `error` is `"<type>: <first line>"`, with `[SPMDxxx]` for
spmdtyped's). A `CELL=CODE` argument (typed and ported) runs that cell once more, under
`with st.allow(CODE):`, when it raised `CODE`: its output then is `"allowed"`'s. Run by
`tests/test_jax_tutorial.py` in a fresh process per flavor (the tutorial sets a global mesh).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pathlib
import re
import sys
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

HERE = pathlib.Path(__file__).parent
TUTORIAL = HERE / "jax_main_cec06d1_shard_map_tutorial.md"

_CELL = re.compile(r"```\{code-cell\}[^\n]*\n(.*?)```", re.S)


def cells(text: str | None = None) -> list[str]:
    """The tutorial's code cells, in order."""
    return _CELL.findall(TUTORIAL.read_text() if text is None else text)


def typed_source(cell: str) -> str:
    """`cell` with JAX's transform spelled `typed_shard_map` (call, decorator, partial)."""
    return re.sub(r"\bjax\.shard_map\b", "typed_shard_map", cell)


def ported_source(cell: str) -> str:
    """`cell` as the codemod ports it (static: the literal specs)."""
    from spmdtyped.adapters._port.codemod import port_source

    return port_source(cell)[0]


def _run(source: str, name: str, namespace: dict[str, Any]) -> dict[str, str | None]:
    buf = io.StringIO()
    error = None
    try:
        with contextlib.redirect_stdout(buf):
            exec(compile(source, name, "exec"), namespace)  # noqa: S102 - JAX's tutorial
    except Exception as e:  # noqa: BLE001 - recorded: the test classifies it
        code = getattr(e, "code", None)
        first = (str(e).splitlines() or [""])[0]
        error = f"{type(e).__name__}: {first}" + (f"  [{code}]" if code and code not in first else "")
    return {"out": buf.getvalue(), "error": error}


def main(flavor: str, out: str, allow: dict[int, str]) -> None:
    if flavor not in ("raw", "typed", "ported"):
        raise SystemExit(f"flavor must be raw, typed or ported, not {flavor!r}")
    namespace: dict[str, Any] = {"__name__": "__tutorial__"}
    if flavor != "raw":
        import spmdtyped as st
        from spmdtyped.adapters import typed_shard_map
        namespace["typed_shard_map"] = typed_shard_map
    got: list[dict[str, Any]] = []
    for i, cell in enumerate(cells()):
        source = {"raw": cell, "typed": typed_source(cell), "ported": ported_source(cell)}[flavor]
        res = _run(source, f"<tutorial cell {i}>", namespace)
        code = allow.get(i)
        if code and res["error"] and f"[{code}]" in res["error"]:
            with st.allow(code):
                res["allowed"] = _run(source, f"<tutorial cell {i}>", namespace)
        got.append(res)
    pathlib.Path(out).write_text(json.dumps(got))


if __name__ == "__main__":
    flavor, out, *rest = sys.argv[1:]
    main(flavor, out, {int(k): v for k, v in (a.split("=", 1) for a in rest)})
