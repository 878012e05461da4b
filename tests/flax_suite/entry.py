"""pytest's entry to flax's own `nnx.shard_map` tests (`flax_18f8f311_shard_map.py`: an
excerpt of flax's `tests/nnx/transforms_test.py`, Apache-2.0 as its `LICENSE` beside it):
`SPMDTYPED_FLAX_SUITE=raw|typed pytest tests/flax_suite/entry.py`. With `typed`, the module's
`nnx` is a view of flax's in which `nnx.shard_map(f, ...)` is `st.adapters.checking(
nnx.shard_map(f, ...))`: every call of the function flax builds is checked by the engine, as
a user checks a step they do not edit; nothing in flax or JAX is modified. Run by
`tests/test_flax_suite.py`, not collected by itself (its name does not start with `test_`)."""

from __future__ import annotations

import atexit
import functools
import os
import pathlib
import sys
import types
from typing import Any

from flax import nnx

#: (named so that pytest does not collect it, `*_test.py`: flax's file sets XLA_FLAGS to four
#: devices when it is imported, which in a collecting process would change every test's)
SUITE = pathlib.Path(__file__).parent / "flax_18f8f311_shard_map.py"


class _NnxView(types.ModuleType):
    """`flax.nnx` with `shard_map` checked (attribute reads only)."""

    def __init__(self) -> None:
        super().__init__("nnx")

    def __getattr__(self, name: str) -> Any:
        return getattr(nnx, name)

    @staticmethod
    def shard_map(f: Any = None, /, **kwargs: Any) -> Any:
        from spmdtyped.adapters import checking

        if f is None:   # the decorator form: @nnx.shard_map(mesh=..., ...)
            return functools.partial(_NnxView.shard_map, **kwargs)
        checked = checking(nnx.shard_map(f, **kwargs))

        @functools.wraps(checked)
        def counted(*args: Any, **kw: Any) -> Any:
            CALLS.append(f.__qualname__)
            return checked(*args, **kw)

        return counted


#: the checked calls made (written at exit to `$SPMDTYPED_FLAX_SUITE_CALLS` when it is set:
#: the test asserts the suite went through `checking`)
CALLS: list[str] = []


def _write_calls() -> None:
    out = os.environ.get("SPMDTYPED_FLAX_SUITE_CALLS")
    if out:
        pathlib.Path(out).write_text("\n".join(CALLS))


def load(flavor: str) -> types.ModuleType:
    if flavor not in ("raw", "typed"):
        raise ValueError(f"flavor must be 'raw' or 'typed', not {flavor!r}")
    mod = types.ModuleType("flax_shard_map_suite")
    mod.__file__ = str(SUITE)
    sys.modules[mod.__name__] = mod
    exec(compile(SUITE.read_text(), str(SUITE), "exec"), mod.__dict__)  # noqa: S102 - flax's file
    if flavor == "typed":
        mod.nnx = _NnxView()  # type: ignore[attr-defined]
    return mod


TestShardMap = load(os.environ.get("SPMDTYPED_FLAX_SUITE", "typed")).TestShardMap
atexit.register(_write_calls)
