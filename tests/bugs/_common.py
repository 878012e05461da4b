"""Shared set-up for the bug programs: 8 simulated CPU devices and the mesh of a module."""

import jax
from jax.sharding import AxisType


def make_mesh(axes: dict[str, int]) -> jax.sharding.Mesh:
    """The mesh `{name: size}` over all 8 devices, Auto axes (inputs may arrive unsharded)."""
    return jax.make_mesh(
        tuple(axes.values()), tuple(axes), axis_types=(AxisType.Auto,) * len(axes)
    )


def normal(seed: int, shape: tuple[int, ...]) -> jax.Array:
    return jax.random.normal(jax.random.key(seed), shape, dtype="float32")
