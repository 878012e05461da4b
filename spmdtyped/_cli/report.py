"""`python -m spmdtyped report FILE[:FUNC]`: the communication report of a step in a file.

The module is loaded from FILE; FUNC (default `report_step`) names a function of it that
returns `(step, args)` or `(step, args, kwargs)`; or, when the module has
`make_mesh`, `make_inputs` and `programs` (the shape of `examples/`), FUNC may be omitted and
the first program of `programs(make_mesh())` is reported on `make_inputs(mesh)`. The phases
of the report are written to stderr on a terminal (`--progress` / `--no-progress`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any


def _load(path: str) -> Any:
    p = Path(path).resolve()
    spec = importlib.util.spec_from_file_location(p.stem, p)
    if spec is None or spec.loader is None:
        raise SystemExit(f"python -m spmdtyped report: cannot load {path}")
    sys.path.insert(0, str(p.parent))
    sys.path.insert(0, str(p.parent.parent))
    module = importlib.util.module_from_spec(spec)
    sys.modules[p.stem] = module
    spec.loader.exec_module(module)
    return module


def _target(module: Any, func: str | None) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    if func is None and all(hasattr(module, n) for n in ("make_mesh", "make_inputs",
                                                         "programs")):
        mesh = module.make_mesh()
        progs = module.programs(mesh)
        return (progs[0] if isinstance(progs, tuple) else progs), \
            tuple(module.make_inputs(mesh)), {}
    name = func or "report_step"
    if not hasattr(module, name):
        raise SystemExit(f"python -m spmdtyped report: {module.__file__} has no {name!r} "
                         "(a function returning (step, args) or (step, args, kwargs))")
    got = tuple(getattr(module, name)())
    step, args, kwargs = got if len(got) == 3 else (*got, {})
    return step, tuple(args), dict(kwargs)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m spmdtyped report",
                                     description="every collective of a step, traced and "
                                                 "compiled, with SPMD7xx flags")
    parser.add_argument("target", help="FILE[:FUNC]; FUNC returns (step, args[, kwargs])")
    parser.add_argument("--json", action="store_true", help="print to_json() instead")
    parser.add_argument("--html", metavar="PATH", help="also write the HTML chart to PATH")
    parser.add_argument("--no-compile", action="store_true", help="the traced program only")
    parser.add_argument("--devices", type=int, default=8,
                        help="simulated CPU devices when JAX is not imported yet (default 8)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="write each phase (trace, walk, lower, compile, parse HLO, match, "
                             "flags) with its count and time to stderr (default: when stderr "
                             "is a terminal)")
    args = parser.parse_args(argv)
    if "jax" not in sys.modules:
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_force_host_platform_device_count" not in flags:
            os.environ["XLA_FLAGS"] = (
                f"{flags} --xla_force_host_platform_device_count={args.devices}").strip()
    path, _, func = args.target.partition(":")
    if not Path(path).is_file():
        print(f"python -m spmdtyped report: no such file: {path}", file=sys.stderr)
        return 2
    from .._report.api import report

    step, a, kw = _target(_load(path), func or None)
    rep = report(step, *a, compile=False if args.no_compile else None,
                 progress=args.progress, **kw)
    print(json.dumps(rep.to_json(), indent=1) if args.json else rep.table())
    if args.html:
        Path(args.html).write_text(rep.html())
    return 1 if rep.flags else 0
