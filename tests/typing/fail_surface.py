# legs: plugin
# ruff: noqa: B015, B018  (expressions evaluated for their static errors)
"""What the runtime rejects in the forms `%`, `//`, `&`, `==`, `~`, `.at[]`, reflected
operators with a Python scalar, and dynamic indexing, the plugin rejects with the same code."""

import jax

import spmdtyped as st
from spmdtyped import Reduced, Unreduced, Varying

Fam = Varying


def modular(u: Unreduced["tp"], r: Reduced["tp"], x: Varying["dp"]) -> None:
    u % 2  # E: spmd-nonlinear-unreduced
    u // 2.0  # E: spmd-nonlinear-unreduced
    r % 2  # E: spmd-reduced-replicated
    x % r  # E: spmd-reduced-replicated


def logical(u: Unreduced["tp"], x: Varying["dp"]) -> None:
    (x > 0.0) & u  # E: spmd-nonlinear-unreduced
    u == 0.0  # E: spmd-nonlinear-unreduced
    u != 0.0  # E: spmd-nonlinear-unreduced
    0.0 == u  # E: spmd-nonlinear-unreduced
    ~u  # E: spmd-nonlinear-unreduced


def scatter(u: Unreduced["tp"], r: Reduced["tp"], x: Varying["dp"]) -> None:
    u.at[0].add(1.0)  # E: spmd-nonlinear-unreduced
    x.at[0].set(u)  # E: spmd-nonlinear-unreduced
    r.at[0].add(1.0)  # E: spmd-reduced-replicated
    r.at[0].set(0.0)  # E: spmd-reduced-replicated


def reflected(u: Unreduced["tp"]) -> None:
    2.0 + u  # E: spmd-unreduced-mismatch
    1 - u  # E: spmd-unreduced-mismatch
    3 % u  # E: spmd-nonlinear-unreduced


def indexing(u: Unreduced["tp"], i: jax.Array, r: Reduced["tp"]) -> None:
    u[i]  # E: spmd-nonlinear-unreduced
    r[st.axis_index("dp")]  # E: spmd-partial-cast


def alias(x: Fam["dp"]) -> Fam["tp"]:
    return x  # E: spmd-out-spec-state
