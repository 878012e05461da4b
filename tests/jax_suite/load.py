"""JAX's own `tests/shard_map_test.py`, loaded with its `shard_map` replaced by spmdtyped's.

Each file is JAX's, unchanged (Apache-2.0, `LICENSE` beside it), for the JAX version named in
its file name (`SUITES` maps an installed version to its file, exact version strings only: a
version without a row skips, as its raw record would be missing too). JAX's wheels and sdists
do not ship their tests, and CI reaches only package registries:

- `jax_0_10_2_shard_map.py`: jax 0.10.2's own `tests/shard_map_test.py`;
- `jax_main_cec06d1_shard_map.py`: JAX's main at commit cec06d116c05f0d52adfceee3d3b730fdbcb0ce5
  (2026-08-08, version string 0.11.1-dev), the newest JAX source reachable here, run on jax
  0.12.0.1 (whose own file is not): 9 of its tests fail as JAX 0.12.0.1 runs them (behaviour
  that changed between the two, recorded in `raw_0_12_0_1.json`), none for want of a test
  utility, so no shim is injected. The same file runs on jax 0.12.1, its outcomes as JAX runs
  them recorded in `raw_0_12_1.json`.

`load(flavor)` executes the file as a module; with `flavor="typed"` its two spellings of the
transform, the module-level `shard_map` (imported from `jax._src.shard_map`) and
`jax.shard_map`, are `st.adapters.typed_shard_map` in that module only (its `jax` is a view of
the real module with that one attribute different): nothing in JAX is modified.
"""

from __future__ import annotations

import pathlib
import sys
import types
from typing import Any

import jax

HERE = pathlib.Path(__file__).parent
#: the vendored suites, by the JAX version they were written for
SUITES = {"0.10.2": HERE / "jax_0_10_2_shard_map.py",
          "0.12.0.1": HERE / "jax_main_cec06d1_shard_map.py",
          "0.12.1": HERE / "jax_main_cec06d1_shard_map.py"}


def suite_for(version: str = jax.__version__) -> pathlib.Path | None:
    """The suite of the installed JAX version, or None when none is vendored for it."""
    return SUITES.get(version)


class _JaxView(types.ModuleType):
    """`jax` with `shard_map` replaced (attribute reads only; the real module is untouched)."""

    def __init__(self, shard_map: Any) -> None:
        super().__init__("jax")
        self.shard_map = shard_map

    def __getattr__(self, name: str) -> Any:
        return getattr(jax, name)


def load(flavor: str, path: pathlib.Path | None = None) -> types.ModuleType:
    """JAX's suite as a module: `flavor` is "raw" (as JAX runs it) or "typed"."""
    if flavor not in ("raw", "typed"):
        raise ValueError(f"flavor must be 'raw' or 'typed', not {flavor!r}")
    path = path or suite_for()
    if path is None:
        raise LookupError(f"no JAX shard_map suite is vendored for jax {jax.__version__} "
                          f"(have: {', '.join(SUITES)})")
    mod = types.ModuleType("jax_shard_map_suite")
    mod.__file__ = str(path)
    sys.modules[mod.__name__] = mod
    exec(compile(path.read_text(), str(path), "exec"), mod.__dict__)  # noqa: S102 - JAX's file
    if flavor == "typed":
        from spmdtyped.adapters import typed_shard_map

        mod.shard_map = typed_shard_map  # type: ignore[attr-defined]
        mod.jax = _JaxView(typed_shard_map)  # type: ignore[attr-defined]
    return mod
