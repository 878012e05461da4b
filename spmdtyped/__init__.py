# ruff: noqa: F405 - `__all__` names the lazy JAX-facing names, which checkers see through
# `from ._static import *` (under TYPE_CHECKING)
"""spmdtyped: type-safe SPMD programs on JAX.

Inside `jax.shard_map` every value has, per manual mesh axis, a state: Invariant, Varying,
Unreduced or Reduced. spmdtyped makes those states Python types (`Varying["dp"]`,
`Reduced["tp"]`, ...) checked by mypy (with `spmdtyped.mypy_plugin`), by beartype/isinstance
at call time, and by typed collectives that raise before any JAX primitive is bound.

`import spmdtyped` does not import JAX: the JAX-facing names load lazily on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._errors import AxisStateError as AxisStateError
from ._errors import BoundaryError as BoundaryError
from ._errors import CastError as CastError
from ._errors import CombineError as CombineError
from ._errors import CommunicationError as CommunicationError
from ._errors import InternalConsistencyError as InternalConsistencyError
from ._errors import SpmdTypeError as SpmdTypeError
from ._errors import UsageError as UsageError
from ._errors import allow as allow
from ._errors import explain as explain
from ._rules import SpmdType as SpmdType
from ._rules import State as State
from ._surface import COLLECTIVE_NAMES as _COLLECTIVE_NAMES
from ._surface import collective as _collective

__version__ = "0.2.0"

if TYPE_CHECKING:
    from . import adapters as adapters
    from . import debug as debug
    from . import lax as lax
    from . import nn as nn
    from . import numpy as numpy
    from ._ops.autodiff import cotangent_type as cotangent_type
    from ._ops.autodiff import grad as grad
    from ._ops.autodiff import value_and_grad as value_and_grad
    from ._ops.autodiff import vjp as vjp
    from ._ops.control import cond as cond
    from ._ops.control import fori_loop as fori_loop
    from ._ops.control import scan as scan
    from ._ops.control import switch as switch
    from ._ops.control import while_loop as while_loop
    from ._ops.custom import CustomOp as CustomOp
    from ._ops.custom import custom_op as custom_op
    from ._ops.custom import opaque as opaque
    from ._ops.optim import clip_by_global_norm as clip_by_global_norm
    from ._ops.optim import global_norm as global_norm
    from ._report.api import report as report
    from ._static import *  # noqa: F403
else:
    from ._typed.hints import Invariant as Invariant
    from ._typed.hints import Partial as Partial
    from ._typed.hints import Reduced as Reduced
    from ._typed.hints import Rep as Rep
    from ._typed.hints import SArray as SArray
    from ._typed.hints import Shard as Shard
    from ._typed.hints import Typed as Typed
    from ._typed.hints import Unreduced as Unreduced
    from ._typed.hints import Varying as Varying

    # name -> module that defines it; loaded (with JAX) on first attribute access
    _LAZY = {
        # the collectives and casts of the surface table (`_surface.COLLECTIVES`)
        **dict.fromkeys(_COLLECTIVE_NAMES, "._ops.collectives"),
        **{n: "._typed.array" for n in ("typeof", "wrap", "unwrap", "set_check_mode", "check_mode",
                                   "local")},
        "shard_map": "._boundary.shard_map",
        **{n: "._ops.optim" for n in ("clip_by_global_norm", "global_norm")},
        **{n: "._ops.autodiff" for n in ("cotangent_type", "grad", "value_and_grad", "vjp")},
        **{n: "._ops.control" for n in ("cond", "fori_loop", "scan", "switch", "while_loop")},
        **{n: "._ops.custom" for n in ("CustomOp", "custom_op", "opaque")},
        "report": "._report.api",  # the communication report
        # jaxtyping interop (imports jax and jaxtyping): st.Float[Varying["dp"], "batch/dp d"]
        **{n: "._typed.jaxtyping" for n in ("Bool", "Float", "Inexact", "Int", "Num", "Shaped")},
    }
    _SUBMODULES = ("numpy", "lax", "adapters", "nn", "debug")

    def __getattr__(name: str) -> Any:
        if name in _LAZY:
            value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        elif name in _SUBMODULES:
            value = importlib.import_module(f".{name}", __name__)
        elif _collective(name) is not None:  # a collective-table row registered after import
            return getattr(importlib.import_module("._ops.collectives", __name__), name)
        else:
            raise AttributeError(f"module 'spmdtyped' has no attribute {name!r}")
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))


# a literal list (not computed): `from spmdtyped import *` gives mypy and pyright its names;
# tests/test_reliability.py checks it against the names the package defines
__all__ = [
    "AxisStateError", "BoundaryError", "CastError", "CombineError", "CommunicationError", "CustomOp",
    "InternalConsistencyError", "Invariant", "Partial", "Reduced", "Rep", "SArray", "Shard",
    "SpmdType", "SpmdTypeError", "State", "Typed", "Unreduced", "UsageError", "Varying",
    "all_gather", "all_to_all", "allow", "axis_index", "axis_size", "check_mode",
    "clip_by_global_norm", "cond", "cotangent_type", "custom_op", "explain", "fori_loop",
    "global_norm", "grad", "local", "opaque", "pbroadcast", "pcast", "pmax", "pmean", "pmin",
    "ppermute", "pshuffle", "psum", "psum_scatter", "pvary", "report", "scan", "set_check_mode", "shard_map",
    "switch", "typeof", "unwrap", "value_and_grad", "vjp", "while_loop", "wrap",
]
