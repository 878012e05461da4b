# legs: plugin mypy pyright stub
"""The axis-vocabulary spelling: bare strings resolve to `axes.dp` / `axes.tp`.

Standard typing for plain mypy and pyright; precise results with the plugin.
"""

from axes import dp, tp  # noqa: F401  (the vocabulary: resolves "dp" and "tp")

import spmdtyped as st
from spmdtyped import Invariant, Reduced, Unreduced, Varying


def layer(x: Varying["dp"], w: Varying["tp"]) -> Varying["dp"]:
    h: Varying["dp | tp"] = x @ w
    return st.psum(h, "tp")


def zero(w_shard: Varying["dp"]) -> Reduced["dp"]:
    return st.all_gather(w_shard, "dp", to="reduced")


def partial(u: Unreduced["tp"], r: Reduced["tp"]) -> Unreduced["tp"]:
    return u * r


def covariant(c: Invariant) -> Varying["dp | tp"]:
    return c
