"""Helpers shared by the test files: meshes, placed and abstract arguments, one `trace`, the
SpmdType shorthands and the state sample of the differential tests.

Import as `from _helpers import ...` (pytest puts `tests/` on `sys.path`). `conftest.py` turns
`mesh_ij` and `mesh_dp_tp` into session fixtures of the same names.
"""

from __future__ import annotations

import functools
import itertools
import math
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import SpmdType

#: the axes of the reference mesh of shared/reference (`mesh_ij`)
AXES = ("i", "j")
#: the replicated spec, the default of the helpers below
REPLICATED = P()


@functools.cache
def mesh_ij() -> Any:
    """The reference mesh of shared/reference: {"i": 2, "j": 4}."""
    return jax.make_mesh((2, 4), AXES)


@functools.cache
def mesh_dp_tp() -> Any:
    """The same 8 devices with real axis names: {"dp": 2, "tp": 4}."""
    return jax.make_mesh((2, 4), ("dp", "tp"))


# ------------------------------------------------------------------------------ arguments


def put(mesh: Any, x: Any, spec: P = REPLICATED) -> Any:
    """`x` placed on `mesh` with `spec`."""
    return jax.device_put(x, NamedSharding(mesh, spec))


def sds(mesh: Any, shape: tuple[int, ...], spec: P = REPLICATED, dtype: Any = jnp.float32) -> Any:
    """An abstract argument of global `shape` placed on `mesh` with `spec`."""
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))


def spec_axes(entry: Any) -> tuple[str, ...]:
    """The mesh axes of one PartitionSpec entry (None, a name or a tuple of names)."""
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def local_sds(mesh: Any, spec: P, local: tuple[int, ...] = (8,), dtype: Any = jnp.float32) -> Any:
    """An abstract argument whose per-device (local) shape is `local` under `spec`."""
    sizes = dict(zip(mesh.axis_names, mesh.devices.shape, strict=True))
    parts = tuple(spec) + (None,) * (len(local) - len(tuple(spec)))
    shape = tuple(n * math.prod(sizes[a] for a in spec_axes(p)) for n, p in zip(local, parts, strict=False))
    return sds(mesh, shape, spec, dtype)


def trace(mesh: Any, body: Callable[..., Any], in_specs: P | tuple[P, ...] = REPLICATED,
          out_specs: Any = None, *, args: Sequence[Any] | None = None,
          local: tuple[int, ...] = (8, 8), smap: Any = st.shard_map, **shard_map_kw: Any) -> Any:
    """Trace `smap(body)` under `jax.jit` (nothing compiled or run) and return the `Traced`.

    `in_specs`: one spec (one argument) or a tuple (one per argument). `args`: the arguments
    (arrays or `sds`); by default one abstract float32 argument per spec whose per-device
    shape is `local`. `out_specs=None`: `body`'s result is discarded (the traced function
    returns a scalar zero with `P()`). `smap`: `st.shard_map` (typed; default) or
    `jax.shard_map` (raw). Extra keywords go to `smap` (`axis_names=...`, `check_vma=...`).
    """
    specs = in_specs if isinstance(in_specs, tuple) else (in_specs,)
    if args is None:
        args = [local_sds(mesh, s, local) for s in specs]
    fn = body
    if out_specs is None:
        def fn(*a: Any) -> Any:
            body(*a)
            return jnp.zeros((), jnp.float32)
        out_specs = P()
    mapped = smap(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, **shard_map_kw)
    return jax.jit(mapped).trace(*args)


# ------------------------------------------------------------------------------ states

I = SpmdType()  # noqa: E741
Vi = SpmdType(varying="i")
Vj = SpmdType(varying="j")
Ui = SpmdType(unreduced="i")
Ri = SpmdType(reduced="i")


def all_states(axes: tuple[str, ...] = AXES) -> list[SpmdType]:
    """Every assignment of I/V/U/R to the axes (16 for two axes)."""
    out = []
    for combo in itertools.product("IVUR", repeat=len(axes)):
        sets: dict[str, set[str]] = {"V": set(), "U": set(), "R": set()}
        for a, s in zip(axes, combo, strict=False):
            if s != "I":
                sets[s].add(a)
        out.append(SpmdType(sets["V"], sets["U"], sets["R"]))
    return out


#: a smaller sample for the expensive products
SAMPLE = [SpmdType(), SpmdType(varying="i"), SpmdType(varying=("i", "j")), SpmdType(unreduced="i"),
          SpmdType(reduced="i"), SpmdType(varying="j", reduced="i"),
          SpmdType(varying="j", unreduced="i")]


def make_raw(x: Any, t: SpmdType) -> Any:
    """A raw JAX value of state `t` built from an Invariant raw value `x` (free casts only)."""
    if t.reduced:
        x = jax.lax.pcast(x, tuple(sorted(t.reduced)), to="reduced")
    vu = tuple(sorted(t.varying | t.unreduced))
    if vu:
        x = jax.lax.pcast(x, vu, to="varying")
    if t.unreduced:
        x = jax.lax.pcast(x, tuple(sorted(t.unreduced)), to="unreduced")
    return x


def make(x: Any, t: SpmdType) -> Any:
    """A typed value of state `t` (see `make_raw`)."""
    return st.wrap(make_raw(x, t))


def trace_raw(fn: Callable[[Any], Any], shape: tuple[int, ...] = (4,)) -> Any:
    """`trace` for the differential tests: `fn(x)` inside a raw full-manual `jax.shard_map` on
    `mesh_ij()`, `x` an Invariant raw float32 value of `shape` (build states with `make_raw`)."""
    return trace(mesh_ij(), fn, local=shape, smap=jax.shard_map)


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    """("ok", result) / ("spmd", code) / ("jax", exception type name) of calling `fn`."""
    try:
        return "ok", fn()
    except st.SpmdTypeError as e:
        return "spmd", e.code
    except Exception as e:  # noqa: BLE001 - JAX raises ValueError/TypeError/NotImplementedError/...
        return "jax", f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def pyright() -> str | None:
    """This environment's pyright executable (the virtualenv's, else the PATH's), or None."""
    return shutil.which("pyright", path=str(Path(sys.executable).parent)) or shutil.which("pyright")


def pyright_or_skip() -> str:
    """`pyright()`, or the test skipped when it is not installed."""
    exe = pyright()
    if exe is None:
        pytest.skip("pyright is not installed (pip install pyright==1.1.414)")
    return exe


def on_face(face: str, body: Callable[..., Any], hinted: Callable[..., Any], **specs: Any
            ) -> Callable[..., Any]:
    """The jitted program of `body` as the face `face` runs it: `"st.shard_map"` (`hinted`,
    the same body with hints on its arguments), `"typed_shard_map"`, `"checking"` (the
    unchanged `jax.shard_map` program wrapped by `st.adapters.checking`) or `"jax"` (raw).
    `specs`: `mesh`, `in_specs`, `out_specs` (and any other keyword of the shard_map)."""
    if face == "st.shard_map":
        return jax.jit(st.shard_map(hinted, **specs))
    smap = st.adapters.typed_shard_map if face == "typed_shard_map" else jax.shard_map
    program = jax.jit(smap(body, **specs))
    return st.adapters.checking(program) if face == "checking" else program


def run_state_step(face: str, body: Callable[..., Any], *, mesh: Any, state: Any, specs: Any,
                   batch: Sequence[Any], **io: Any) -> Any:
    """`body(state, a, b)` jitted on `face` (`on_face`; for `"st.shard_map"` hinted with
    `state: Any` and two batch arrays Varying over dp), `state` placed by `specs` and each
    array of `batch` (two) sharded over dp. `io`: `in_specs`, `out_specs`."""
    def hinted(state: Any, a: st.Varying["dp"], b: st.Varying["dp"]) -> Any:
        return body(state, a, b)

    program = on_face(face, body, hinted, mesh=mesh, **io)
    return program(jax.tree.map(lambda a, s: put(mesh, a, s), state, specs),
                   *(put(mesh, a, P("dp")) for a in batch))


def assert_trees_close(got: Any, want: Any, rtol: float = 1e-4, atol: float = 1e-6) -> None:
    """Every leaf of `got` allclose to the same leaf of `want` (the same structure of leaves)."""
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=atol)


def assert_each_differs(*pairs: tuple[Any, Any], rtol: float = 1e-3) -> None:
    """Each `(got, want)` pair of arrays differs beyond `rtol` (a bug's loss and gradients
    against one device's)."""
    for got, want in pairs:
        assert not np.allclose(np.asarray(got), np.asarray(want), rtol=rtol)


def line_ending_with(path: str, marker: str) -> int:
    """The number of the first line of the file `path` that ends with `marker` (a test file's
    own marker comment: `# the bias before the psum`)."""
    with open(path) as f:
        return next(n for n, text in enumerate(f, 1) if text.rstrip().endswith(marker))


_PROJECTS = itertools.count()


def module_project(tmp_path: Path, module_text: str, script_text: str, *, prefix: str,
                   script: str) -> tuple[Path, Path, str]:
    """A module and the script that imports it, in a folder of their own (`port
    --enable-vma` of several files): the module named `{prefix}_N` (unique in the process, so
    that each test imports its own), the script's `{prefix}` placeholder filled in with that
    name. `(script path, module path, module name)`."""
    name = f"{prefix}_{next(_PROJECTS)}"
    folder = tmp_path / name
    folder.mkdir()
    module = folder / f"{name}.py"
    module.write_text(module_text)
    path = folder / script
    path.write_text(script_text.format(**{prefix: name}))
    return path, module, name
