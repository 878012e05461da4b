"""Shared set-up for the bug programs: 8 simulated CPU devices and the mesh of a module."""

import os

if "jax" not in __import__("sys").modules:  # standalone runs; under pytest conftest.py did this
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
from jax.sharding import AxisType  # noqa: E402


def make_mesh(axes: dict[str, int]) -> jax.sharding.Mesh:
    """The mesh `{name: size}` over all 8 devices, Auto axes (inputs may arrive unsharded)."""
    return jax.make_mesh(
        tuple(axes.values()), tuple(axes), axis_types=(AxisType.Auto,) * len(axes)
    )


def normal(seed: int, shape: tuple[int, ...]) -> jax.Array:
    return jax.random.normal(jax.random.key(seed), shape, dtype="float32")
