# legs: plugin mypy
# ruff: noqa: F821  (bare-string axes: no vocabulary in this module)
"""The module's mesh declares its axes (`jax.make_mesh(..., ("dp", "tp"))`, here inside a
function): a hint or a collective naming another axis is `spmd-unknown-axis` (SPMD501, the
closest axis suggested) where it is written, not a later `assignment` between two states.
Plain mypy reads each bare-string axis as an undefined name (`name-defined`: declare an axis
vocabulary there, `fail_vocab.py`)."""

import jax

import spmdtyped as st
from spmdtyped import Invariant, Varying


def layer(x: Varying["dp"], w: Varying["tp"]) -> Varying["dp"]:  # E[mypy]: name-defined name-defined
    return st.psum(x @ w, "tp")


def typo_in_hint(x: Varying["dp"], w: Varying["tq"]) -> Varying["dp"]:  # E: spmd-unknown-axis E[mypy]: name-defined name-defined
    return st.psum(x @ w, "tp")


def typo_in_collective(x: Varying["dp", "tp"]) -> Invariant:  # E[mypy]: type-arg name-defined name-defined
    return st.psum(x, ("dp", "tpp"))  # E: spmd-unknown-axis


def main() -> None:
    mesh = jax.make_mesh((2, 4), ("dp", "tp"))
    with jax.set_mesh(mesh):
        pass
