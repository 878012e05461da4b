# legs: plugin mypy pyright
"""Boundary mistakes every checker catches with the plugin-free spelling, and the mistakes
only the plugin catches (marked `E:` only)."""

from typing import Literal

import spmdtyped as st
from spmdtyped import Invariant, Reduced, Varying


def wrong_axis(x: Varying[Literal["tp"]]) -> Varying[Literal["dp"]]:
    return x  # E: spmd-out-spec-state  E[mypy]: return-value  E[pyright]: reportReturnType


def reduced_is_not_invariant(w: Reduced[Literal["tp"]]) -> Invariant:
    return w  # E: spmd-out-spec-state  E[mypy]: return-value  E[pyright]: reportReturnType


def takes_invariant(c: Invariant) -> None: ...


def call(x: Varying[Literal["dp"]]) -> None:
    takes_invariant(x)  # E: arg-type  E[mypy]: arg-type  E[pyright]: reportArgumentType


def seed(w: Reduced[Literal["tp"]]) -> Invariant:
    return st.psum(w, "tp")  # E: spmd-reduced-operand


def not_summed(x: Varying[Literal["dp"]]) -> Invariant:
    return st.pmean(x, "dp") * 2 + x  # E: spmd-out-spec-state
