"""`python -m spmdtyped port FILE...`: rewrite raw shard_map code with the codemod
(`adapters/_port/codemod.py`); with `--entry`, trace the entry functions first and annotate the
states JAX observed."""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from typing import Any

import libcst as cst

from ..adapters._port.codemod import port_source


def _observed_states(path: str, args: argparse.Namespace) -> tuple[Any, Any]:
    """Checked mode from the command line: import `path`, trace each `--entry` function
    on the `--shapes` under the mesh, and observe the states its functions see."""
    import inspect
    import math
    import os

    from .args import load_function, parse_mesh, parse_shapes, parse_specs

    names, sizes = parse_mesh(args.mesh) if args.mesh else ((), ())
    shapes = parse_shapes(args.shapes)
    if "jax" not in sys.modules:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        flag = f"--xla_force_host_platform_device_count={max(8, math.prod(sizes))}"
        if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
    import jax
    from jax.sharding import PartitionSpec

    from .. import _compat
    from ..adapters._port.observe import observe_all

    in_specs = parse_specs(args.in_specs, PartitionSpec)
    out_specs = parse_specs(args.out_specs, PartitionSpec)
    fns = [inspect.unwrap(load_function(f"{os.path.abspath(path)}:{e}")) for e in args.entry]
    mesh = jax.make_mesh(sizes, names) if names else _compat.context_mesh(concrete=True)
    if mesh is None:
        raise ValueError("no --mesh, and the module sets none (jax.set_mesh)")
    sds = [jax.ShapeDtypeStruct(shape, dtype) for dtype, shape in shapes]
    runs = [(f, sds, in_specs, out_specs) for f in fns]
    return observe_all(runs, file=fns[0].__code__.co_filename, mesh=mesh)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spmdtyped port",
        description="Rewrite raw jax.shard_map code to spmdtyped: checked collectives, "
                    "checked shard_map, annotations from the specs; with --entry, typed code "
                    "whose annotations are the states observed while JAX traces it.")
    parser.add_argument("files", nargs="+", metavar="FILE")
    parser.add_argument("--write", action="store_true", help="rewrite the files in place")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if any file would change (prints the diff)")
    checked = parser.add_argument_group(
        "checked mode (one FILE): trace the --entry functions and port to typed code")
    checked.add_argument("--entry", action="append", default=[], metavar="FUNC",
                         help="a function of FILE given to shard_map (repeatable)")
    checked.add_argument("--mesh", help="axis sizes, e.g. dp=2,tp=4 (default: the module's "
                                        "jax.set_mesh)")
    checked.add_argument("--in-specs", help="Python expression, e.g. \"(P('dp'), P(None, 'tp'))\"")
    checked.add_argument("--out-specs", help="Python expression, e.g. \"P('dp')\"")
    checked.add_argument("--shapes", help="global argument shapes, e.g. \"f32[8,16] f32[16,32]\"")
    args = parser.parse_args(list(argv) if argv is not None else None)
    states = declared = None
    if args.entry:
        if len(args.files) != 1 or not (args.in_specs and args.out_specs and args.shapes):
            print("error: --entry needs one FILE and --in-specs, --out-specs, --shapes",
                  file=sys.stderr)
            return 2
        try:
            states, declared = _observed_states(args.files[0], args)
        except Exception as e:  # noqa: BLE001 - usage problems and crashes: exit 2
            print(f"error: cannot observe {args.files[0]}: {type(e).__name__}: {e}",
                  file=sys.stderr)
            return 2
    changed = 0
    for path in args.files:
        try:
            with open(path, encoding="utf-8") as fh:
                old = fh.read()
            new, changes = port_source(old, states, declared)
        except (OSError, cst.ParserSyntaxError) as e:
            print(f"{path}: error: {e}", file=sys.stderr)
            return 2
        skipped = [c.removeprefix("unannotated: ") for c in changes
                   if c.startswith("unannotated: ")]
        if skipped:
            print(f"{path}: left unannotated (no array state, or different states at "
                  f"different calls): {', '.join(skipped)}", file=sys.stderr)
        if new == old:
            continue
        changed += 1
        if args.write:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(new)
            print(f"ported {path}")
        else:
            sys.stdout.writelines(difflib.unified_diff(
                old.splitlines(keepends=True), new.splitlines(keepends=True),
                fromfile=f"a/{path}", tofile=f"b/{path}"))
    if changed == 0:
        print("nothing to port", file=sys.stderr)
    return 1 if args.check and changed else 0



if __name__ == "__main__":
    sys.exit(main())
