"""Which primitives the engine's walks follow, by name: the refinement walk's structural
rules (`refine_walk`), the primitives JAX types from their inputs (never opaque), those that
keep a pre-divided share, and `FOLLOWED`, every one of them with the rule table's
(`_surface.PRIMITIVE_REFINE`): what `st.shard_map(strict=True)` does not report."""

from __future__ import annotations

from .. import _surface
from .._rules.primitives import IDENTITIES as IDENTITIES

#: primitives whose result is still the share (`Refinement.share`) its operand was
KEEPS_SHARE = frozenset({"broadcast_in_dim", "reshape", "squeeze", "expand_dims", "pvary",
                          "convert_element_type", "transpose"}) | IDENTITIES
#: primitives with a rule here (structural) or elsewhere: never "opaque"
STRUCTURAL = frozenset({"dot_general", "transpose", "reshape", "broadcast_in_dim", "squeeze",
                         "expand_dims", "slice", "dynamic_slice", "gather", "concatenate", "pad",
                         "iota", "sort", "rev", "axis_index", "split", "dynamic_update_slice",
                         "scatter", "scatter-add", "scatter_add", "full", "empty"})
#: call-like primitives whose one nested jaxpr takes the equation's operands in order
CALLS = frozenset({"pjit", "jit", "closed_call", "core_call", "remat", "checkpoint",
                   "custom_jvp_call"})
#: primitives that compute on their operands without a rule here, whose output states JAX
#: derives from the inputs (so they never drop an axis): not opaque either
KNOWN_PLAIN = frozenset({"eigh", "svd", "qr", "cholesky", "triangular_solve", "lu",
                          "custom_linear_solve", "while", "cond", "scan", "random_bits",
                          "random_seed", "random_wrap", "random_unwrap", "threefry2x32",
                          "erf_inv", "clz", "top_k", "reduce_xor", "reduce_and", "reduce_or",
                          "conv_general_dilated", "fft", "cumlogsumexp", "select_and_scatter_add",
                          "reduce_window_sum", "reduce_window_max", "reduce_window_min",
                          "optimization_barrier", "device_put",
                          "custom_vjp_call", "custom_vjp_call_jaxpr", "shard_map"}) | CALLS
#: every primitive the walk follows (the rest: `_opaque`, or plain Varying; strict=True lists them)
FOLLOWED = set(_surface.PRIMITIVE_REFINE) | STRUCTURAL | KNOWN_PLAIN
