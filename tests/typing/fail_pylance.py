# legs: stub
"""The editor tier's catches next to the forms it takes (pass_pylance.py): misuse in a
decorated body is the runtime's code; what pyright reports for an `Any` argument of a function
(a known limit, for every family: collectives, casts, `st.numpy`, `st.nn`; pyright keeps every
overload an `Any` argument may match unless their results agree, and reports the deprecation of
any of them, docs/pyright.md; annotate the value), and that an operator with an `Any` operand
reports nothing."""

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
    st.pcast(g, "tp", to="varying")  # E[stub]: reportDeprecated
    st.numpy.tanh(g)  # E[stub]: reportDeprecated
    st.nn.relu(g)  # E[stub]: reportDeprecated


def unannotated(g, u: Unreduced["tp"], r: Reduced["tp"]):
    st.psum(g, "tp")  # E[stub]: reportDeprecated
    return u + g, g + u, r * g, g @ r  # an operator with an Any operand is Any: no error
