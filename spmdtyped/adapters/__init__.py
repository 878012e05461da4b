"""`st.adapters`: porting existing raw `jax.shard_map` code to spmdtyped, in steps.

1. `import spmdtyped.lax as lax`: the drop-in `jax.lax` whose collectives check states.
2. `typed_shard_map(f, mesh=, in_specs=, out_specs=)`: run a raw per-shard function with
   checks at its inputs, outputs and collectives, no edit of `f`.
3. `infer(f, *args, mesh=, in_specs=, out_specs=)`: trace `f`, check every equation with the
   strict rules, and get the typed signature to paste (`python -m spmdtyped infer`).
4. `checking(step)`: `step` with every shard_map it stages checked by the engine.
5. `python -m spmdtyped port FILE...`: a codemod that rewrites the imports and shard_map
   calls and inserts the annotations the specs determine.

The guide is `docs/porting.md`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# JAX loads on first use (as for `spmdtyped`): `python -m spmdtyped infer` must configure
# the device count before JAX is imported.
_LAZY = {"CheckVmaWarning": "._infer", "InferReport": "._infer", "hint": "._infer", "infer": "._infer",
         "checking": "._typed", "typed_shard_map": "._typed",
         "Step": ".._engine.walk"}

if TYPE_CHECKING:
    from .._engine.walk import Step as Step
    from ._infer import CheckVmaWarning as CheckVmaWarning
    from ._infer import InferReport as InferReport
    from ._infer import hint as hint
    from ._infer import infer as infer
    from ._typed import checking as checking
    from ._typed import typed_shard_map as typed_shard_map


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'spmdtyped.adapters' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = sorted(_LAZY)
