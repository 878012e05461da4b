import jax
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import Varying

mesh = jax.make_mesh((2, 4), ("dp", "tp"))


@st.shard_map(mesh=mesh, in_specs=(P("dp"), P(None, "tp"), P("tp", None)), out_specs=P("dp"))
def mlp(x: Varying["dp"], w1: Varying["tp"], w2: Varying["tp"]) -> Varying["dp"]:
    h: Varying["dp", "tp"] = st.numpy.tanh(x @ w1)   # this device's rows x its columns
    partial: Varying["dp", "tp"] = h @ w2            # per-device partial products over tp
    return st.psum(partial, "tp")                    # Varying["dp"]: summed over tp
