# legs: plugin mypy pyright stub
# ruff: noqa: F722  (jaxtyping dims strings)
"""The refinement spellings every checker reads: `Shard["tp", Literal[-1]]`, `Partial["tp"]`,
`Rep["tp"]` and jaxtyping's `Float[Varying["tp"], "b d/tp"]` are `Varying["tp"]` for plain mypy
and pyright (no error, no refinement); the plugin refines them. (`Shard["tp", -1]`, with a bare
int, is the plugin's shorter spelling: `-1` is not a type for the other checkers.)"""

from typing import Literal

from axes import dp, tp  # noqa: F401  (the vocabulary: resolves "dp" and "tp")

import spmdtyped as st
from spmdtyped import Invariant, Varying


def row_parallel(h: st.Shard["tp", Literal[-1]], w2: st.Shard["tp", Literal[-2]],
                 b: Invariant) -> Invariant:
    return st.psum(h @ w2, "tp") + b


def column_parallel(x: st.Float[Varying["dp"], "b d"], w1: st.Float[Varying["tp"], "d f/tp"]
                    ) -> st.Float[Varying["dp | tp"], "b f/tp"]:
    return x @ w1


def partial_sum(p: st.Partial["tp"], r: st.Rep["tp"]) -> Invariant:
    return st.psum(p * r, "tp")


def gradual(v: Varying["tp"], s: st.Shard["tp", Literal[-1]], p: st.Partial["tp"]) -> Varying["tp"]:
    partial_sum(v, v)                      # plain Varying values fit refined parameters
    keep(s)                                # refined values fit plain ones
    return p


def keep(x: Varying["tp"]) -> st.Shard["tp", Literal[-1]]:
    return x
