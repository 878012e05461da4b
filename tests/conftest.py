import os

# 8 simulated CPU devices, set before JAX is imported anywhere in the test session.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402


@pytest.fixture(scope="session")
def mesh():
    """The reference mesh of shared/reference: {"i": 2, "j": 4}, Explicit axes."""
    return jax.make_mesh((2, 4), ("i", "j"))


@pytest.fixture(scope="session")
def mesh_dp_tp():
    return jax.make_mesh((2, 4), ("dp", "tp"))


def put(mesh, x, spec=P()):
    return jax.device_put(x, NamedSharding(mesh, spec))
