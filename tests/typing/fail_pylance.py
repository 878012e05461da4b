# legs: stub
"""The editor tier's catches next to the forms it takes (pass_pylance.py): misuse in a
decorated body is the runtime's code; what pyright reports for an `Any` argument (a known
limit: pyright reports a deprecation when any overload an `Any` argument may match is
deprecated, docs/pyright.md; annotate the value)."""

from typing import Any

import jax
from axes import dp, tp  # noqa: F401  (the vocabulary: resolves "dp" and "tp")
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import Invariant, Reduced, Unreduced, Varying

mesh = jax.make_mesh((2, 4), ("dp", "tp"))


@st.shard_map(mesh=mesh, in_specs=P(), out_specs=P())
def decorated(r: Reduced["tp"], u: Unreduced["tp"], i: Invariant) -> Invariant:
    st.psum(r, "tp")  # E[stub]: reportDeprecated
    u + i  # E[stub]: reportDeprecated
    return i


def any_argument(g: Any, losses: list[Varying["dp"]]) -> None:
    st.pmean(g, "dp")  # E[stub]: reportDeprecated
    jax.tree.map(lambda loss: st.pmean(loss, "dp"), losses)  # E[stub]: reportDeprecated
