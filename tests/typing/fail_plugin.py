# legs: plugin
# ruff: noqa: B015, B018, F841  (expressions evaluated for their static errors)
"""Every misuse the plugin reports, with its `spmd-*` code (the runtime's SPMD code)."""

from typing import Literal

import spmdtyped as st
from spmdtyped import Invariant, Reduced, Typed, Unreduced, Varying

PERM = [(0, 1), (1, 0)]


def seed(w: Reduced["tp"], m: Typed[Varying["dp"], Reduced["tp"]]) -> None:
    st.psum(w, "tp")  # E: spmd-reduced-operand
    st.ppermute(m, "tp", PERM)  # E: spmd-reduced-operand
    st.all_gather(w, "tp")  # E: spmd-reduced-operand
    st.pmean(m, ("dp", "tp"))  # E: spmd-reduced-operand


def zero_style(w_shard: Varying["dp"]) -> None:
    w = st.all_gather(w_shard, "dp", to="reduced")
    st.psum(w, "dp")  # E: spmd-reduced-operand


def unreduced(u: Unreduced["tp"]) -> None:
    st.all_gather(u, "tp")  # E: spmd-unreduced-operand
    st.ppermute(u, "tp", PERM)  # E: spmd-unreduced-operand
    st.pmax(u, "tp")  # E: spmd-unreduced-kind


def double_sum(x: Varying["dp"], c: Invariant) -> None:
    g = st.psum(x, "dp")
    st.psum(g, "dp")  # E: spmd-invariant-operand
    st.pmean(c, "dp")  # E: spmd-invariant-operand
    st.psum(x, ("dp", "tp"))  # E: spmd-mixed-states


def pmean_denominator(m: Typed[Varying["dp"], Unreduced["tp"]]) -> None:
    st.pmean(m, "dp")  # E: spmd-pmean-denominator


def operators(x: Varying["dp"], u: Unreduced["tp"], v: Unreduced["dp"], r: Reduced["tp"],
              r2: Reduced["dp"], w: Varying["tp"], c: Invariant, xw: Varying["dp", "tp"]) -> None:
    u * u  # E: spmd-unreduced-mismatch
    u + v  # E: spmd-unreduced-mismatch
    u + x  # E: spmd-unreduced-mismatch
    u @ w  # E: spmd-unreduced-mismatch
    u ** 2  # E: spmd-nonlinear-unreduced
    u < 0.0  # E: spmd-nonlinear-unreduced
    -u  # E: spmd-nonlinear-unreduced
    r + r2  # E: spmd-reduced-mismatch
    r + c  # E: spmd-reduced-replicated
    r + x  # E: spmd-reduced-replicated
    r + xw  # E: spmd-partial-cast
    abs(u)  # E: spmd-nonlinear-unreduced
    u.max()  # E: spmd-nonlinear-unreduced
    u[st.axis_index("tp")]  # E: spmd-nonlinear-unreduced


def casts(x: Varying["dp"], c: Invariant, r: Reduced["tp"]) -> None:
    st.pvary(x, "dp")  # E: spmd-unsupported-cast
    st.pcast(x, "dp", to="reduced")  # E: spmd-unsupported-cast
    st.pcast(c, "dp", to="unreduced")  # E: spmd-unsupported-cast
    st.pcast(r, "tp", to="unreduced")  # E: spmd-unsupported-cast


def axes(x: Varying["dp", "tp"]) -> None:
    st.psum(x, ("dp", "dp"))  # E: spmd-bad-axes
    st.psum(x, ["dp"])  # E: call-overload
    st.pcast(x, "dp", to="invarying")  # E: spmd-unknown-target
    st.all_gather(x, "dp", to="reduce")  # E: spmd-unknown-target


def hints(
    a: Typed["dp"],  # E: spmd-bad-hint
    b: Typed[Varying["dp"], Reduced["dp"]],  # E: spmd-bad-hint
    c: Varying[int],  # E: spmd-bad-hint
    d: Varying["dp", "dp"],  # E: spmd-bad-hint
    e: Varying["not an axis"],  # E: spmd-bad-hint
) -> None: ...


def boundaries(x: Varying["dp", "tp"], u: Unreduced["tp"]) -> Varying["dp"]:
    y: Invariant = st.psum(x, "tp")  # E: assignment
    z: Invariant = u  # E: assignment
    return st.psum(x, "dp")  # E: spmd-out-spec-state


def literal_spelling(w: Reduced[Literal["tp"]]) -> None:
    st.psum(w, "tp")  # E: spmd-reduced-operand


def typed_numpy(u: Unreduced["tp"], x: Varying["dp"]) -> None:
    st.numpy.exp(u)  # E: spmd-nonlinear-unreduced
    st.numpy.cumsum(u, axis=0)  # E: spmd-nonlinear-unreduced
    st.numpy.where(x > 0.0, u, 0.0)  # E: spmd-nonlinear-unreduced


def local_loss(w: Invariant, x: Varying["dp"]) -> Varying["dp"]:
    return (x @ w).sum()


def unreduced_loss(x: Varying["dp"]) -> Unreduced["dp"]:
    return st.pcast(x, "dp", to="unreduced")


def autodiff(w: Invariant, x: Varying["dp"]) -> None:
    g = st.grad(local_loss)(w, x)
    st.pmean(g, "dp")  # E: spmd-invariant-operand
    st.grad(unreduced_loss)  # E: spmd-grad-loss-state
    # ZeRO's gradient of the gathered (Reduced) weight is Unreduced: a lambda loss, called at once
    r = st.all_gather(x, "dp", tiled=True, to="reduced")
    _, gr = st.value_and_grad(lambda p: (x @ p).sum())(r)
    st.ppermute(gr, "dp", [(0, 1), (1, 0)])  # E: spmd-unreduced-operand
