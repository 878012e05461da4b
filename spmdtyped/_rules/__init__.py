"""THE rule table: manual-axis states and what every op does to them.

Data plus pure functions, importing neither JAX nor mypy, split by concern (one job each):

- `states`: `State`, `SpmdType`, `cotangent`;
- `features`: `Features`, the rules that differ between JAX versions;
- `axes`: axis-name spellings and mesh membership;
- `axis_ops`: collectives and casts (`AXIS_OPS`, `axis_op`);
- `elementwise` + `combine`: elementwise ops (`ELEMENTWISE`) and their combination rule;
- `functions`: composite forms (traced indexing, take, constructors and fills, `.at[]`);
- `lattice`: THE join/cast lattice (carries, branches, predicates, custom ops, cotangents);
- `boundary`: the shard_map boundary (specs, out_spec check, full-manual rule, hint text);
- `primitives`: jaxpr primitive -> rule maps; `docs`: stricter/looser-than-JAX tables;
- `caching`: `hashable_cache`, the memo of the pure readers of specs, dtypes, name stacks.

Which rule each Python form uses is `spmdtyped._surface`. Sources:
`shared/reference/jax_semantics.md` and its matrices (jax 0.10.2 and 0.12.0.1). Where JAX is
silently wrong (reference §6) the table is strict and names a code that `st.allow(code)` opts
out of; the JAX-compatible result is recorded next to it.

This package re-exports every name the rest of spmdtyped reads as `_rules.X`.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from .arguments import (
    DTYPE_KINDS,
    POSITIONAL,
    REAL_PARTS,
    SECONDARY,
    STATIC_DTYPE,
    UNKNOWN,
    argument_rule,
    call_type,
    dtype_rule,
    named_arguments,
    secondary_join,
)
from .axes import check_axes_known, normalize_axes
from .axis_ops import (
    ALL_GATHER_TARGETS,
    AXIS_OPS,
    PCAST_TARGETS,
    AxisOp,
    Outcome,
    all_gather_op,
    axis_index_type,
    axis_op,
    pcast_op,
)
from .combine import binary, combine, unary
from .elementwise import (
    ELEMENTWISE,
    JAX_DROPPING,
    JAX_DROPS,
    JAX_KEEPS,
    KEEP,
    LITERAL,
    NONLINEAR_NARY,
    REJECT,
    VARY,
    Combined,
    ElementwiseRule,
    Linearity,
    Operand,
)
from .features import CONSERVATIVE, JAX_0_10, JAX_0_12, JAX_0_12_1, Feature, Features
from .functions import (
    AT_METHODS,
    CONSTRUCTORS,
    FILL_ARGUMENTS,
    LIKE_CONSTRUCTORS,
    MEAN,
    SUM_THEN_DIVIDE,
    at_update_type,
    auto_cast,
    constructor_type,
    dynamic_index_type,
    fill_type,
    mean_bind,
    mean_type,
    take_type,
    where_type,
)
from .states import INVARIANT, UNREDUCED_KINDS, I, R, SpmdType, State, U, V, cotangent, fmt_axes

# `boundary`, `docs`, `lattice` and `primitives` (shard_map boundaries, the docs' tables, joins
# and casts of control flow / custom ops / cotangents, jaxpr primitives) load on first use: the
# mypy plugin needs none of them for most programs, and compiles every module it imports where
# Python writes no bytecode. Checkers see the names here; `__getattr__` finds them at run time.
if TYPE_CHECKING:
    from .boundary import (
        check_full_manual,
        check_full_manual_value,
        check_out_spec,
        check_return,
        hint_text,
        in_spec_type,
        spec_text,
    )
    from .docs import LOOSER_THAN_JAX, STRICTER_THAN_JAX, TRANSPOSES
    from .lattice import (
        BODY_LABELS,
        FREE_CASTS,
        PREDICATE_WHERE,
        REINTERPRETING_CASTS,
        branch_labels,
        check_cotangent,
        check_vmap_grad,
        custom_op_type,
        flow_state,
        free_casts,
        grad_loss_type,
        join_carry,
        join_state,
        parse_states,
        predicate_labels,
        predicate_type,
        widen_under_predicate,
    )
    from .primitives import ARGUMENT_PRIMITIVES, PRIMITIVE_OPERANDS, PRIMITIVES, primitive_rule

_LAZY_MODULES = ("boundary", "docs", "lattice", "primitives")

_MISSING = object()
_HERE = os.path.dirname(__file__)


def __getattr__(name: str) -> Any:
    if name in _LAZY_MODULES:
        return importlib.import_module(f".{name}", __name__)
    # `from ._rules import refine_shape` asks for a submodule not imported yet: let the import
    # system import it (searching the lazy modules would import them all)
    if not name.startswith("__") and not (os.path.exists(os.path.join(_HERE, f"{name}.py"))
                                            or os.path.isdir(os.path.join(_HERE, name))):
        for module in _LAZY_MODULES:
            value = getattr(importlib.import_module(f".{module}", __name__), name, _MISSING)
            if value is not _MISSING:
                globals()[name] = value
                return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ALL_GATHER_TARGETS", "AT_METHODS", "AXIS_OPS", "BODY_LABELS",
    "CONSERVATIVE", "CONSTRUCTORS", "ELEMENTWISE", "FREE_CASTS", "INVARIANT", "JAX_0_10",
    "JAX_0_12", "JAX_0_12_1", "JAX_DROPPING", "JAX_DROPS", "JAX_KEEPS", "KEEP", "LIKE_CONSTRUCTORS", "LITERAL",
    "LOOSER_THAN_JAX", "NONLINEAR_NARY", "PCAST_TARGETS", "PREDICATE_WHERE", "PRIMITIVES",
    "PRIMITIVE_OPERANDS", "REINTERPRETING_CASTS", "REJECT", "STRICTER_THAN_JAX", "TRANSPOSES",
    "UNREDUCED_KINDS", "AxisOp", "Combined", "ElementwiseRule", "Feature", "Features", "I",
    "Linearity", "Operand", "Outcome", "R", "SpmdType", "State", "U", "V", "all_gather_op",
    "at_update_type", "auto_cast", "axis_index_type", "axis_op", "binary", "branch_labels",
    "check_axes_known", "check_cotangent", "check_vmap_grad", "check_full_manual", "check_full_manual_value", "check_out_spec", "check_return", "combine",
    "constructor_type", "cotangent", "custom_op_type", "dynamic_index_type", "fill_type",
    "flow_state", "fmt_axes", "free_casts", "grad_loss_type", "hint_text", "in_spec_type",
    "join_carry", "join_state", "mean_type", "normalize_axes", "parse_states", "pcast_op", "predicate_labels",
    "predicate_type", "primitive_rule", "spec_text", "take_type", "unary", "where_type", "widen_under_predicate",
    # issue 12: rules that depend on arguments
    "ARGUMENT_PRIMITIVES", "POSITIONAL", "SECONDARY", "STATIC_DTYPE", "UNKNOWN", "VARY", "argument_rule", "call_type", "named_arguments",
    "secondary_join",
    # rows whose rule depends on dtypes; constructors' fill arguments; how a mean is bound
    "DTYPE_KINDS", "FILL_ARGUMENTS", "MEAN", "REAL_PARTS", "SUM_THEN_DIVIDE", "dtype_rule",
    "mean_bind",
]
