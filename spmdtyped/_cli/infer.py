"""`python -m spmdtyped infer module:function --mesh dp=2,tp=4 --in-specs ... --shapes ...`.

Prints the typed signature of a raw per-shard function, a per-line listing of the states
of every traced equation, and the strict-rule violations. Exit status: 0 when the function
is clean, 1 when there are violations, 2 for bad usage or a crash (the module fails to import,
JAX rejects the program for a reason that is not a manual-axis type).

The target may be decorated (`@jax.shard_map(...)`, `@st.adapters.typed_shard_map(...)`,
`@jax.jit`): the per-shard function inside is checked. `--mesh` may be omitted when the module
sets one at import (`jax.set_mesh(mesh)`).
"""

from __future__ import annotations

import argparse
import inspect
import linecache
import math
import os
import sys

from .args import load_function, parse_mesh, parse_shapes, parse_specs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spmdtyped infer",
        description="Infer the typed signature of a raw per-shard function and check it with "
                    "spmdtyped's strict rules.")
    parser.add_argument("target", help="module:function or path/to/file.py:function")
    parser.add_argument("--mesh", help="axis sizes, e.g. dp=2,tp=4 (default: the mesh the module "
                                       "sets with jax.set_mesh at import)")
    parser.add_argument("--in-specs", required=True,
                        help="Python expression, e.g. \"(P('dp'), P(None, 'tp'))\"")
    parser.add_argument("--out-specs", required=True, help="Python expression, e.g. \"P('dp')\"")
    parser.add_argument("--shapes", required=True,
                        help="global argument shapes, e.g. \"f32[8,16] f32[16,32]\"")
    parser.add_argument("--all-lines", action="store_true",
                        help="list equations from every file, not only the function's")
    parser.add_argument("--casts", action="store_true",
                        help="also list the pvary casts JAX inserts by itself")
    args = parser.parse_args(argv)

    try:
        names, sizes = parse_mesh(args.mesh) if args.mesh else ((), ())
        shapes = parse_shapes(args.shapes)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if "jax" not in sys.modules:
        # tracing needs only abstract values, but a mesh needs that many devices (and a module
        # that builds its own mesh at import, typically 8)
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        flag = f"--xla_force_host_platform_device_count={max(8, math.prod(sizes))}"
        if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()

    import jax
    from jax.sharding import PartitionSpec

    from .. import _compat
    from .._errors import SpmdTypeError
    from ..adapters._infer import infer

    try:
        fn = inspect.unwrap(load_function(args.target))
        in_specs = parse_specs(args.in_specs, PartitionSpec)
        out_specs = parse_specs(args.out_specs, PartitionSpec)
    except Exception as e:  # noqa: BLE001 - report usage problems, not tracebacks
        print(f"error: cannot load {args.target}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    if not isinstance(in_specs, tuple):
        in_specs = (in_specs,)
    if len(shapes) != len(in_specs):
        print(f"error: {len(shapes)} shapes for {len(in_specs)} in_specs", file=sys.stderr)
        return 2
    mesh = jax.make_mesh(sizes, names) if names else _compat.context_mesh(concrete=True)
    if mesh is None:
        print("error: no --mesh, and the module sets none (jax.set_mesh)", file=sys.stderr)
        return 2
    sds = [jax.ShapeDtypeStruct(shape, dtype) for dtype, shape in shapes]
    try:
        rep = infer(fn, *sds, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
    except SpmdTypeError as e:
        print(f"{getattr(e, 'source', None) or '?'}: {e.code}\n{e}", file=sys.stderr)
        return 2 if e.code.startswith("SPMD5") else 1
    except Exception as e:  # noqa: BLE001 - a crash is exit 2, not "violations found"
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"error: tracing {args.target} failed: {type(e).__name__}: {first}", file=sys.stderr)
        return 2

    print(rep.signature)
    print()
    home = getattr(getattr(fn, "__code__", None), "co_filename", None)
    last = None
    for step in rep.steps:
        if step.file is None or (not args.all_lines and home and step.file != home):
            continue
        if step.auto and not args.casts:
            continue
        key = (step.file, step.line)
        if key != last:
            src = linecache.getline(step.file, step.line or 0).rstrip()
            print(f"{os.path.basename(step.file)}:{step.line}: {src.strip()}")
            last = key
        print(f"    {step.describe()}")
    print()
    if rep.violations:
        print(f"{len(rep.violations)} violation(s):")
        for v in rep.violations:
            print(f"{getattr(v, 'source', None) or '?'}: {v.code}")
            print("    " + str(v).replace("\n", "\n    "))
        return 1
    print("ok: no violations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
