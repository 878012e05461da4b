import os

# 8 simulated CPU devices, set before JAX is imported anywhere in the test session.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import _helpers  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def mesh_ij():
    """The reference mesh of shared/reference: {"i": 2, "j": 4} (`_helpers.mesh_ij`)."""
    return _helpers.mesh_ij()


@pytest.fixture(scope="session")
def mesh_dp_tp():
    """{"dp": 2, "tp": 4} on the same 8 devices (`_helpers.mesh_dp_tp`)."""
    return _helpers.mesh_dp_tp()
