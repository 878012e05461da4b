# legs: plugin mypy pyright
"""With an axis vocabulary a misspelled axis is an error for every checker."""

from axes import dp, tp  # noqa: F401

import spmdtyped as st
from spmdtyped import Invariant, Reduced, Varying


def misspelled(x: Varying["dq"]) -> None: ...  # E: name-defined  E[mypy]: name-defined  E[pyright]: reportUndefinedVariable


def wrong_axis(x: Varying["tp"]) -> Varying["dp"]:
    return x  # E: spmd-out-spec-state  E[mypy]: return-value  E[pyright]: reportReturnType


def seed(w: Reduced["tp"]) -> Invariant:
    return st.psum(w, "tp")  # E: spmd-reduced-operand


def double_sum(x: Varying["dp"]) -> Invariant:
    g = st.psum(x, "dp")
    return st.psum(g, "dp")  # E: spmd-invariant-operand
