"""`st.nn`: typed `jax.nn` basics (relu, gelu, silu, sigmoid, softplus, softmax, log_softmax,
logsumexp, one_hot).

Each binds the `jax.nn` function on the raw value (the compiled program is the hand-written
one) and types the result with its `_rules.ELEMENTWISE` rule: all are non-linear, so an
Unreduced input is rejected (SPMD202: reduce it first). relu, gelu, softplus, softmax,
log_softmax, logsumexp and one_hot mix an Invariant constant into their input, which JAX
rejects next to a Reduced value (reference Q20): spmdtyped raises SPMD203 first; silu and
sigmoid keep Reduced.
Softmax-like functions reduce over local dimensions only (`axis`), never over mesh axes.

!!! Example
    ```python
    p = st.nn.softmax(scores, axis=-1)        # scores: Varying["dp", "tp"] -> same state
    ```
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax

from . import _surface
from ._rules import ELEMENTWISE, REJECT
from ._typed.array import call_function

#: st.nn function -> its `_rules.ELEMENTWISE` rule, from the surface table's `st.nn` rows
#: (`_surface.NN`, read by the mypy plugin and the docs too)
RULES: dict[str, str] = {r.name: r.rule for r in _surface.NN if r.rule is not None}


def _make(row: _surface.Row) -> Callable[..., Any]:
    name, rule_name = row.name, RULES[row.name]
    op = f"st.nn.{name}"
    rule = ELEMENTWISE[rule_name]
    jfn = getattr(jax.nn, row.jax.removeprefix("jax.nn."))

    def f(x: Any, *args: Any, **kwargs: Any) -> Any:
        # softmax-like rows read `axis`/`keepdims` (a Shard dim normalised locally: SPMD211)
        return call_function(rule_name, x, jfn, args, kwargs, op=op, refine=row.refine)

    f.__name__ = f.__qualname__ = name
    f.__module__ = __name__
    reduced = ("rejects Reduced (JAX mixes in an Invariant constant)"
               if rule.on_reduced == REJECT else "keeps Reduced")
    f.__doc__ = (f"Typed `jax.nn.{name}` (non-linear: rejects Unreduced; {reduced}).\n\n"
                 f"**Arguments:** as `jax.nn.{name}`; `x` typed or raw.\n\n"
                 f"**Returns:** a typed value in the input's state.\n\n"
                 f"**Raises:** `CombineError` SPMD202 (Unreduced input)"
                 f"{', SPMD203 (Reduced input)' if rule.on_reduced == REJECT else ''}.\n\n"
                 f"!!! Example\n    ```python\n    y = st.nn.{name}(x)\n    ```\n")
    return f


for _row in _surface.NN:
    globals()[_row.name] = _make(_row)

if TYPE_CHECKING:  # made in the loop above; declared for type checkers
    gelu: Callable[..., Any]
    log_softmax: Callable[..., Any]
    logsumexp: Callable[..., Any]
    one_hot: Callable[..., Any]
    relu: Callable[..., Any]
    sigmoid: Callable[..., Any]
    silu: Callable[..., Any]
    softmax: Callable[..., Any]
    softplus: Callable[..., Any]

assert set(RULES) == {n for n, v in globals().items() if getattr(v, "__module__", None) == __name__
                      and callable(v) and not n.startswith("_")}

__all__ = ["gelu", "log_softmax", "logsumexp", "one_hot", "relu", "sigmoid", "silu", "softmax",
           "softplus"]
