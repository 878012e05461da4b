# legs: plugin
# mypy: disable-error-code="empty-body"
"""Control flow: carries and branch outputs that no free cast joins (SPMD302), caught from the
bodies' declared types."""

from typing import Any

import spmdtyped as st
from spmdtyped import Invariant, Unreduced, Varying


def reduce_carry(i: Any, acc: Unreduced["tp"]) -> Invariant: ...
def keep(a: Any) -> Invariant: ...
def partial(a: Any) -> Unreduced["tp"]: ...
def add_partial(i: Any, acc: Unreduced["tp"]) -> Unreduced["tp"]: ...


def loops(u: Unreduced["tp"], x: Varying["dp"]) -> None:
    st.fori_loop(0, 4, reduce_carry, u)  # E: spmd-carry-state
    st.fori_loop(0, st.axis_index("tp"), add_partial, u)  # E: spmd-carry-state
    st.cond(True, keep, partial, x)  # E: spmd-carry-state
    i0 = st.psum(x, "dp")
    st.fori_loop(0, 4, lambda i, c: st.pmean(c, "dp"), i0)  # E: spmd-invariant-operand
