import os

# 8 simulated CPU devices, set before JAX is imported (no accelerator needed)
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import spmdtyped as st  # noqa: E402
from spmdtyped import Varying  # noqa: E402

mesh = jax.make_mesh((2, 4), ("dp", "tp"))


@st.shard_map(mesh=mesh, in_specs=(P("dp"), P(None, "tp"), P("tp", None)), out_specs=P("dp"))
def mlp(x: Varying["dp"], w1: Varying["tp"], w2: Varying["tp"]) -> Varying["dp"]:
    h: Varying["dp", "tp"] = st.numpy.tanh(x @ w1)   # this device's rows x its columns
    partial: Varying["dp", "tp"] = h @ w2            # per-device partial products over tp
    return st.psum(partial, "tp")                    # Varying["dp"]: summed over tp
