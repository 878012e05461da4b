"""Elementwise ops, matmul, reductions over local dimensions: one `ElementwiseRule` per op
(`ELEMENTWISE`), saying how the op is linear and what it does to Unreduced and Reduced
operands. `combine` applies a row (reference §3).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Union

from .features import Feature
from .states import SpmdType


class Linearity(enum.StrEnum):
    ADDITIVE = "additive"        # add, sub: U only with U on the same axes
    MULTIPLICATIVE = "mul"       # mul: U x R(same axes) -> U
    DIVIDE = "div"               # div: U / R(same axes) -> U
    DOT = "dot"                  # dot_general: rejects U, drops R, no reduced check
    SELECT = "select"            # where: JAX takes U/R from the false branch only
    NONLINEAR = "nonlinear"      # rejects U; R passes if all operands agree
    LINEAR = "linear"            # unary structural/linear: U and R pass through


# what JAX does with an Unreduced operand of a unary op
KEEP, REJECT, JAX_DROPS, JAX_KEEPS = "keep", "reject", "jax-drops", "jax-keeps"
#: on_reduced: JAX types the op on a Reduced value but cannot lower it (jax 0.10.2 and
#: 0.12.0.1: `ShardingTypeError: Inputs cannot be replicated...` or a bare NotImplementedError
#: at lowering). spmdtyped binds the equivalent that lowers: cast the Reduced axes to Varying
#: first (`pcast(to='varying')`, free); the result is Varying there.
VARY = "vary"


@dataclasses.dataclass(frozen=True)
class ElementwiseRule:
    name: str
    linearity: Linearity
    #: unary ops: what happens to an Unreduced input (KEEP: linear; REJECT: JAX errors;
    #: JAX_DROPS / JAX_KEEPS: JAX silently drops / keeps it -> strict SPMD202)
    on_unreduced: str = REJECT
    #: unary ops: KEEP, "drop" (JAX silently drops the marker), or REJECT
    on_reduced: str = KEEP
    #: Features flag needed for KEEP on Unreduced (else JAX raises NotImplementedError)
    unreduced_feature: Feature | None = None
    #: Features flag needed to keep Reduced (else JAX drops it)
    reduced_feature: Feature | None = None
    #: how messages name an argument-dependent row (`pad` with a non-zero constant, ...)
    label: str | None = None
    #: Features flag under which JAX rejects an Unreduced / a Reduced operand that earlier
    #: versions take (jax 0.12.1: `NO_RULE_REJECTS` for primitives without an
    #: unreduced/reduced rule, `PAD_VALUE_STATE` for pad's Invariant padding value)
    unreduced_rejected_by: Feature | None = None
    reduced_rejected_by: Feature | None = None


def _ew(name: str, lin: Linearity, **kw: str | Feature | None) -> ElementwiseRule:
    return ElementwiseRule(name, lin, **kw)  # type: ignore[arg-type]


ADDITIVE, MULTIPLICATIVE, DIVIDE = Linearity.ADDITIVE, Linearity.MULTIPLICATIVE, Linearity.DIVIDE
DOT, SELECT, NONLINEAR, LINEAR = Linearity.DOT, Linearity.SELECT, Linearity.NONLINEAR, Linearity.LINEAR

LINEAR_UNARY = ("reshape", "transpose", "squeeze", "expand_dims", "broadcast_to", "getitem",
                 "pad", "astype", "copy", "stop_gradient", "split", "roll",
                 "tile", "repeat", "conj", "sum", "ravel", "swapaxes", "moveaxis")
NONLINEAR_UNARY = ("exp", "log", "tanh", "sin", "cos", "sqrt", "rsqrt", "abs", "square",
                    "sign", "log1p", "expm1",
                    "floor", "ceil", "round", "logical_not", "isnan", "isfinite",
                    "erf", "norm",
                    # JAX has no Unreduced rule for the real/imag primitives (complex inputs;
                    # jnp.real/imag of a real array need no primitive: st.numpy handles that)
                    "real", "imag")
NONLINEAR_NARY = ("maximum", "minimum", "pow", "lt", "le", "gt", "ge", "eq", "ne", "and", "or",
                   "xor", "arctan2")
JAX_DROPPING = ("cumsum", "cummax", "cummin", "flip", "argmax", "argmin",
              "integer_pow", "prod", "at_set",
              "reciprocal")  # jnp.reciprocal is integer_pow(x, -1) (differential tests)
#: jax.nn functions that mix an Invariant constant into their input: JAX rejects a Reduced input
#: (`Inputs cannot be replicated...`, reference Q20); silu and sigmoid do not.
NONLINEAR_NO_REDUCED = ("relu", "gelu", "softplus", "softmax", "log_softmax", "logsumexp",
                         "one_hot",
                         # jnp.var/std/mod/floor_divide do too, for every dtype (differential
                         # tests, jax 0.10.2 and 0.12.0.1)
                         "var", "std", "mod", "floordiv")
#: `.at[].add/.mul/.min/.max` (scatter-add etc.): jax 0.12 keeps U and rejects R for add; jax
#: 0.10 drops both. Strict: Unreduced rejected (SPMD202), Reduced rejected (SPMD203).
SCATTERS = ("at_add", "at_mul", "at_min", "at_max")
#: rows whose primitive has no unreduced/reduced rule in JAX (earlier versions drop the state)
_NO_RULE = {"unreduced_rejected_by": Feature.NO_RULE_REJECTS,
            "reduced_rejected_by": Feature.NO_RULE_REJECTS}

ELEMENTWISE: dict[str, ElementwiseRule] = {
    r.name: r
    for r in [
        _ew("add", ADDITIVE), _ew("sub", ADDITIVE, unreduced_feature=Feature.UNREDUCED_SUB_NEG),
        _ew("mul", MULTIPLICATIVE), _ew("div", DIVIDE, unreduced_feature=Feature.UNREDUCED_DIV),
        _ew("matmul", DOT), _ew("dot", DOT), _ew("einsum", DOT), _ew("where", SELECT),
        _ew("neg", LINEAR, on_unreduced=KEEP, unreduced_feature=Feature.UNREDUCED_SUB_NEG),
        _ew("max", NONLINEAR, on_unreduced=REJECT, reduced_feature=Feature.REDUCE_MAX_KEEPS_REDUCED),
        _ew("min", NONLINEAR, on_unreduced=REJECT, reduced_feature=Feature.REDUCE_MAX_KEEPS_REDUCED),
        _ew("mean", LINEAR, on_unreduced=KEEP),  # sum, then a literal-cast division
        _ew("sort", NONLINEAR, on_unreduced=JAX_KEEPS, on_reduced=VARY),
        # lowering fails on a Reduced value (both JAX versions): cast to Varying first
        _ew("sigmoid", NONLINEAR, on_reduced=VARY), _ew("silu", NONLINEAR, on_reduced=VARY),
        _ew("cumprod", NONLINEAR, on_unreduced=JAX_DROPS, on_reduced=VARY, **_NO_RULE),
        # argument-dependent forms (`arguments.argument_rule` picks them from keywords and
        # dtypes): affine or non-linear where the plain op is linear
        # pad(constant_values != 0): JAX keeps Unreduced and adds the constant once per device
        _ew("pad_affine", NONLINEAR, on_unreduced=JAX_KEEPS, label="pad with a non-zero constant"),
        # pad(mode="maximum"/"minimum"): jax 0.10 keeps Unreduced (wrong), 0.12 raises
        _ew("pad_extremum", NONLINEAR, on_unreduced=JAX_KEEPS,
            label="pad(mode='maximum'/'minimum')"),
        # pad(mode="mean"/"median"/"linear_ramp"/callable): JAX mixes in an Invariant constant
        # (Reduced: `Inputs cannot be replicated`; Unreduced: NotImplementedError / wrong)
        _ew("pad_mixing", NONLINEAR, on_reduced=REJECT,
            label="pad(mode='mean'/'median'/'linear_ramp')"),
        # astype to an integer (from floating/complex) or to bool: rounding is not linear
        _ew("astype_nonlinear", NONLINEAR, on_unreduced=JAX_KEEPS,
            label="astype to an integer or bool dtype"),
        # sum(dtype=int/bool) of a floating value: a cast, then the sum
        _ew("sum_nonlinear", NONLINEAR, on_unreduced=JAX_KEEPS,
            label="sum with an integer or bool dtype"),
        # sum/prod/max/min(initial=c): an Invariant constant joins (JAX rejects Unreduced and
        # Reduced)
        _ew("reduce_initial", NONLINEAR, on_reduced=REJECT, label="a reduction with initial="),
        # sum/prod/max/min(where=mask): a select with an Invariant filler, whose state JAX keeps
        # (Unreduced dropped: wrong numbers; Reduced dropped: replicated, Invariant)
        _ew("reduce_where", NONLINEAR, on_unreduced=JAX_DROPS, on_reduced="drop",
            label="a reduction with where="),
        # x[i] with a traced i: JAX raises NotImplementedError on U, keeps R (both versions)
        _ew("dynamic_slice", NONLINEAR),
        # jax.lax.dynamic_slice_in_dim: the same primitive (its own name: its rows' refinement
        # follows the sliced dim, `x[i]`'s the index expression)
        _ew("dynamic_slice_in_dim", NONLINEAR),
        # tril / triu: a select with an Invariant zero; JAX drops Unreduced and Reduced for
        # tril(k=0) and keeps them for triu(k=1) (both versions): strict, both rejected
        *(_ew(n, NONLINEAR, on_unreduced=JAX_DROPS, on_reduced=REJECT) for n in ("tril", "triu")),
        *(_ew(n, LINEAR, on_unreduced=KEEP) for n in LINEAR_UNARY if n != "tile"),
        # jax 0.12.1 types tile of an Unreduced value but cannot lower it
        _ew("tile", LINEAR, on_unreduced=KEEP,
            unreduced_rejected_by=Feature.TILE_UNREDUCED_UNLOWERABLE),
        # pad(constant 0): linear; jax 0.12.1 wants the padding value Unreduced / Reduced as
        # well, and jnp.pad's is an Invariant 0 (`pad` itself: edge/wrap modes, lax.pad)
        _ew("pad_zero", LINEAR, on_unreduced=KEEP, label="pad with a zero constant",
            unreduced_rejected_by=Feature.PAD_VALUE_STATE,
            reduced_rejected_by=Feature.PAD_VALUE_STATE),
        # pad(mode="reflect"/"symmetric"): linear, through JAX's rev (no unreduced/reduced rule)
        _ew("pad_reverse", LINEAR, on_unreduced=KEEP, label="pad(mode='reflect'/'symmetric')",
            **_NO_RULE),
        *(_ew(n, NONLINEAR) for n in NONLINEAR_UNARY),
        *(_ew(n, NONLINEAR) for n in NONLINEAR_NARY),
        *(_ew(n, NONLINEAR, on_unreduced=JAX_DROPS, on_reduced="drop", **_NO_RULE)
          for n in JAX_DROPPING),
        *(_ew(n, NONLINEAR, on_reduced=REJECT) for n in NONLINEAR_NO_REDUCED),
        # n-ary structural ops: like add, Unreduced only with Unreduced on the same axes (JAX
        # also accepts U next to I, which counts the I part once per device)
        _ew("concatenate", ADDITIVE, on_unreduced=KEEP), _ew("stack", ADDITIVE, on_unreduced=KEEP),
        # gather: jax 0.10 drops U and R; jax 0.12 rejects U and keeps R
        _ew("take", NONLINEAR, on_unreduced=JAX_DROPS, reduced_feature=Feature.GATHER_KEEPS_REDUCED),
        *(_ew(n, NONLINEAR, on_unreduced=JAX_DROPS, on_reduced=REJECT) for n in SCATTERS),
    ]
}


class _LiteralOperand:
    """A Python scalar operand: Invariant, unless spmdtyped casts it to match (see `combine`)."""

    def __repr__(self) -> str:
        return "LITERAL"


LITERAL = _LiteralOperand()
Operand = Union[SpmdType, _LiteralOperand]


@dataclasses.dataclass(frozen=True)
class Combined:
    """Result of `combine`: the output type, and the axes (if any) on which spmdtyped casts
    Python-scalar operands to Reduced before binding (looser than JAX, which rejects them)."""

    type: SpmdType
    literal_reduced: frozenset[str] = frozenset()
    #: how the runtime binds it when not as the op itself: "integer_pow" (`x ** k`, k an int
    #: literal) or "mul_reciprocal" (`u / c` as `u * (1/c)` where JAX has no Unreduced div)
    bind: str | None = None


