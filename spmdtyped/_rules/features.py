"""What the installed JAX supports: the rules that differ between JAX versions.

`Features` holds one documented boolean per difference; `Feature` names a flag in the rule
tables (`ElementwiseRule.unreduced_feature`), and `Features.has` reads it by attribute, never
by string. `_compat` picks the installed version's set, the mypy plugin `CONSERVATIVE` unless
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

    def has(self, flag: Feature | None) -> bool:
        """Whether this JAX has `flag` (`None`: a rule every version has)."""
        if flag is None:
            return True
        return {
            Feature.UNREDUCED_KIND: self.unreduced_kind,
            Feature.UNREDUCED_SUB_NEG: self.unreduced_sub_neg,
            Feature.UNREDUCED_DIV: self.unreduced_div,
            Feature.REDUCE_MAX_KEEPS_REDUCED: self.reduce_max_keeps_reduced,
            Feature.GATHER_KEEPS_REDUCED: self.gather_keeps_reduced,
            Feature.MOD_REDUCED_DIVISOR: self.mod_reduced_divisor,
            Feature.WHERE_PAIRWISE_CAST: self.where_pairwise_cast,
        }[flag]


JAX_0_10 = Features("jax 0.10")
JAX_0_12 = Features("jax 0.12", unreduced_kind=True, unreduced_sub_neg=True, unreduced_div=True,
                    reduce_max_keeps_reduced=True, gather_keeps_reduced=True,
                    mod_reduced_divisor=True, where_pairwise_cast=True)
#: What the mypy plugin assumes unless configured: only what every supported JAX allows.
CONSERVATIVE = JAX_0_10


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
