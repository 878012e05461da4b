"""What the installed JAX supports: the rules that differ between JAX versions.

`Features` holds one documented boolean per difference; `Feature` names a flag in the rule
tables (`ElementwiseRule.unreduced_feature`), its value the field's name, which `Features.has`
reads. `_compat` picks the installed version's set, the mypy plugin `CONSERVATIVE` unless
configured, the docs list every field with its `doc` metadata.
"""

from __future__ import annotations

import dataclasses
import enum

from .._errors import allowed


def _flag(doc: str) -> bool:
    return dataclasses.field(default=False, metadata={"doc": doc})  # type: ignore[no-any-return]


class Feature(enum.Enum):
    """A version-dependent rule, as the rule tables name it."""

    UNREDUCED_KIND = "unreduced_kind"
    UNREDUCED_SUB_NEG = "unreduced_sub_neg"
    UNREDUCED_DIV = "unreduced_div"
    REDUCE_MAX_KEEPS_REDUCED = "reduce_max_keeps_reduced"
    GATHER_KEEPS_REDUCED = "gather_keeps_reduced"
    MOD_REDUCED_DIVISOR = "mod_reduced_divisor"
    WHERE_PAIRWISE_CAST = "where_pairwise_cast"
    NO_RULE_REJECTS = "no_rule_rejects"
    LIKE_KEEPS_STATE = "like_keeps_state"
    PAD_VALUE_STATE = "pad_value_state"
    SLICE_INDEX_INVARIANT = "slice_index_invariant"
    REDUCED_LOSS_GRAD = "reduced_loss_grad"
    LOOP_TRANSPOSES_REDUCED = "loop_transposes_reduced"
    TILE_UNREDUCED_UNLOWERABLE = "tile_unreduced_unlowerable"


@dataclasses.dataclass(frozen=True)
class Features:
    """Rules that differ between JAX versions; `_compat` picks the installed version's set.

    Every field is documented by its `doc` metadata (the docs' feature table reads it).
    """

    name: str
    unreduced_kind: bool = _flag(
        "0.12: Unreduced values record their pending reduction (sum, max or min), so "
        "pmax/pmin accept an Unreduced max/min; 0.10 has pending sums only")
    unreduced_sub_neg: bool = _flag(
        "0.12: U - U and -U stay Unreduced; 0.10 raises NotImplementedError")
    unreduced_div: bool = _flag(
        "0.12: U / R (Reduced on the same axes) -> U; 0.10 has no Unreduced division rule "
        "(spmdtyped binds u / c as u * (1/c))")
    reduce_max_keeps_reduced: bool = _flag(
        "0.12: jnp.max / jnp.min of a Reduced value stay Reduced; 0.10 drops the Reduced state")
    gather_keeps_reduced: bool = _flag(
        "0.12: jnp.take of a Reduced value stays Reduced; 0.10 drops the Reduced state")
    mod_reduced_divisor: bool = _flag(
        "0.12: mod(V:i, R:i) -> V:i; 0.10 rejects a Reduced divisor of % and //")
    where_pairwise_cast: bool = _flag(
        "0.12: jnp.where auto-casts x and y to each other before the condition, so a Reduced "
        "branch must be Reduced on exactly the other branch's extra Varying axes; 0.10 casts "
        "the three operands together")
    no_rule_rejects: bool = _flag(
        "0.12.1: a primitive without an unreduced/reduced rule (cumsum, cumprod, cummax, rev, "
        "argmax, integer_pow, reduce_prod, scatter) raises NotImplementedError on an Unreduced or "
        "Reduced operand; 0.10 and 0.12.0 silently drop the state")
    like_keeps_state: bool = _flag(
        "0.12.1: zeros_like / ones_like / full_like / empty_like keep their argument's "
        "Unreduced and Reduced axes (an Unreduced fill is kept on one device, zeros on the "
        "others); 0.10 and 0.12.0 return a constant that is Varying where the argument is")
    pad_value_state: bool = _flag(
        "0.12.1: pad needs its padding value Unreduced / Reduced on the operand's unreduced / "
        "reduced axes, so jnp.pad of an Unreduced or Reduced value raises (its constant is "
        "Invariant); 0.10 and 0.12.0 keep the operand's state")
    slice_index_invariant: bool = _flag(
        "0.12.1: dynamic_slice rejects a varying start index on an operand that is Unreduced "
        "or Reduced; 0.10 and 0.12.0 slice it")
    reduced_loss_grad: bool = _flag(
        "0.12.1: jax.grad of a Reduced loss seeds an Unreduced cotangent (the gradients' sum "
        "is the derivative of the replicated loss); 0.10 and 0.12.0 raise (SPMD405)")
    loop_transposes_reduced: bool = _flag(
        "0.12.1: scan / while loops over Reduced carries or constants are differentiated (the "
        "gradient is Unreduced); 0.10 and 0.12.0 mistype the cotangents (SPMD406)")
    tile_unreduced_unlowerable: bool = _flag(
        "0.12.1: jnp.tile (its new tile primitive) of an Unreduced value traces but fails when "
        "lowered (`'UnreducedArray' object has no attribute 'val'`); spmdtyped rejects it "
        "(SPMD202); 0.10 and 0.12.0 tile it")

    def has(self, flag: Feature | None) -> bool:
        """Whether this JAX has `flag` (`None`: a rule every version has). `Feature`'s values
        are this class's field names (`tests/test_features.py` holds them to it)."""
        return flag is None or bool(getattr(self, flag.value))


JAX_0_10 = Features("jax 0.10")
JAX_0_12 = Features("jax 0.12", unreduced_kind=True, unreduced_sub_neg=True, unreduced_div=True,
                    reduce_max_keeps_reduced=True, gather_keeps_reduced=True,
                    mod_reduced_divisor=True, where_pairwise_cast=True)
JAX_0_12_1 = dataclasses.replace(JAX_0_12, name="jax 0.12.1", no_rule_rejects=True,
                                 like_keeps_state=True, pad_value_state=True,
                                 slice_index_invariant=True, reduced_loss_grad=True,
                                 loop_transposes_reduced=True, tile_unreduced_unlowerable=True)
#: What the mypy plugin assumes unless configured: only what every supported JAX allows (jax
#: 0.10's permissions, jax 0.12.1's rejections; zeros_like of an Unreduced value as jax 0.10).
CONSERVATIVE = dataclasses.replace(JAX_0_10, name="conservative", no_rule_rejects=True,
                                   pad_value_state=True, slice_index_invariant=True,
                                   tile_unreduced_unlowerable=True)


#: the codes `st.allow` can turn a memoised rule's result around with (the rules consult
#: `allowed(code)` for these only)
RULE_ALLOWANCES = ("SPMD103", "SPMD202")
_KEYS = {(a, b): frozenset(c for c, on in zip(RULE_ALLOWANCES, (a, b), strict=True) if on)
         for a in (False, True) for b in (False, True)}


def active_allowances() -> frozenset[str]:
    """Which of `RULE_ALLOWANCES` `st.allow` opts out of right now: part of every memoised
    rule's key, so that a result under `st.allow` is never served outside it (two context
    variable reads per op while tracing)."""
    return _KEYS[allowed("SPMD103"), allowed("SPMD202")]
