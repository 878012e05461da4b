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
import importlib
import importlib.util
import inspect
import linecache
import math
import os
import re
import sys
from typing import Any

_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64",
           "i32": "int32", "i64": "int64", "i8": "int8", "u8": "uint8", "bool": "bool"}


def parse_mesh(text: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """`"dp=2,tp=4"` -> `(("dp", "tp"), (2, 4))`."""
    names, sizes = [], []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, size = part.partition("=")
        if not name or not size.isdigit():
            raise ValueError(f"--mesh: expected NAME=SIZE,..., got {part!r}")
        names.append(name.strip())
        sizes.append(int(size))
    return tuple(names), tuple(sizes)


def parse_shapes(text: str) -> list[tuple[str, tuple[int, ...]]]:
    """`"f32[4,8] f32[8,16]"` (or `"4,8 8,16"`, float32) -> [(dtype, shape), ...];
    arguments are separated by spaces or `;`, `[]` is a scalar."""
    out = []
    for tok in re.findall(r"[A-Za-z0-9_]*\[[^\]]*\]|[^\s;]+", text):
        m = re.fullmatch(r"([A-Za-z0-9_]*)\[([^\]]*)\]", tok)
        dtype, dims = (m.group(1) or "f32", m.group(2)) if m else ("f32", tok)
        shape = tuple(int(d) for d in dims.replace("x", ",").split(",") if d.strip())
        out.append((_DTYPES.get(dtype, dtype), shape))
    return out


def load_function(target: str) -> Any:
    """`package.module:function` or `path/to/file.py:function`."""
    mod_name, _, fn_name = target.rpartition(":")
    if not mod_name or not fn_name:
        raise ValueError(f"expected module:function, got {target!r}")
    if mod_name.endswith(".py") or os.sep in mod_name:
        spec = importlib.util.spec_from_file_location(
            os.path.splitext(os.path.basename(mod_name))[0], mod_name)
        if spec is None or spec.loader is None:
            raise ValueError(f"cannot load {mod_name}")
        loaded = sys.modules.get(spec.name)
        if loaded is not None and getattr(loaded, "__file__", None) == spec.origin:
            module = loaded  # imported once, as `import` would (its import-time effects too)
        else:
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        module = importlib.import_module(mod_name)
    fn = module
    for attr in fn_name.split("."):
        fn = getattr(fn, attr)
    return fn


def _specs(text: str, P: Any) -> Any:
    # the spec expression is the user's own command line; only P/PartitionSpec are in scope
    value = eval(text, {"__builtins__": {}}, {"P": P, "PartitionSpec": P, "None": None})  # noqa: S307
    return value


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
    from ._infer import infer

    try:
        fn = inspect.unwrap(load_function(args.target))
        in_specs = _specs(args.in_specs, PartitionSpec)
        out_specs = _specs(args.out_specs, PartitionSpec)
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
