"""The command line's shared inputs: `--mesh`, `--shapes` and `--in-specs` / `--out-specs`
texts, and `FILE:FUNC` / `module:function` targets (read by `infer` and `port`), parsed
(`Flags`)."""


from __future__ import annotations

import argparse
import importlib
import importlib.util
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


def _spec_value(text: str, P: Any) -> Any:
    # the spec expression is the user's own command line; only P/PartitionSpec are in scope
    value = eval(text, {"__builtins__": {}}, {"P": P, "PartitionSpec": P, "None": None})  # noqa: S307
    return value


def parse_specs(text: str, P: Any) -> Any:
    """A `--in-specs` / `--out-specs` expression (only `P` / `PartitionSpec` in scope)."""
    return _spec_value(text, P)


class Flags:
    """The command line's mesh, specs and shapes, parsed (None where not given)."""

    def __init__(self, args: argparse.Namespace, mesh_sizes: Any) -> None:
        import jax

        names, sizes = mesh_sizes
        self.mesh_obj = jax.make_mesh(sizes, names) if names else None
        self.in_specs, self.out_specs = args.in_specs, args.out_specs
        self.sds = None if not args.shapes else tuple(
            jax.ShapeDtypeStruct(shape, dtype) for dtype, shape in parse_shapes(args.shapes))
