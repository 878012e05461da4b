# legs: plugin
"""A module whose mesh axis names are not literals (a variable, a mesh from elsewhere) declares
no axes: every axis a hint or a collective names is accepted (`fail_meshes.py` has the
literal case)."""

import jax

import spmdtyped as st
from spmdtyped import Varying

NAMES = ("data", "model")


def layer(x: Varying["data"], w: Varying["model"]) -> Varying["data"]:
    return st.psum(x @ w, "model")


def main() -> None:
    mesh = jax.make_mesh((2, 4), NAMES)
    del mesh
