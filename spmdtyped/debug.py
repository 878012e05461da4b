"""`st.debug.print`: print from inside `st.shard_map` once per distinct value.

`jax.debug.print` inside `shard_map` prints once per device: 8 identical lines for an Invariant
loss on a 2 x 4 mesh, and unlabelled lines for Varying values. `st.debug.print` reads the
states of its arguments: the devices whose values are all the same print nothing but the first
one's line, and each line of a Varying value is labelled with the device's index on the axes
the values vary (or are partial) on: `[dp=1] loss 0.25`.
"""

from __future__ import annotations

import builtins
import threading
from typing import Any

import jax

from . import _compat
from ._typed.array import is_typed, typeof, unwrap

#: one line at a time from the device threads that run the callbacks
_PRINT_LOCK = threading.Lock()


def print(fmt: str, *args: Any, **kwargs: Any) -> None:  # noqa: A001 - jax.debug.print's name
    """Typed `jax.debug.print`: one line per distinct value, labelled by device index.

    **Arguments:** as `jax.debug.print`: a `str.format` string and its arguments (typed values,
    raw JAX values, Python values; pytrees too).

    **Returns:** nothing; prints at run time. Use it in a jitted `st.shard_map` (an eager,
    un-jitted shard_map runs debug callbacks on only some devices).

    Outside `shard_map` it is `jax.debug.print`. Inside, an argument Invariant on every manual
    axis prints once (from the device at index 0 of every axis); Varying or Unreduced ones print
    once per index on those axes, prefixed `[dp=0 tp=1]` (an Unreduced value prints its
    per-device partial parts).

    !!! Example
        ```python
        st.debug.print("loss {}", loss)        # Invariant: one line
        st.debug.print("local sum {}", x.sum())  # Varying["dp"]: "[dp=0] ...", "[dp=1] ..."
        ```
    """
    raw_args, raw_kwargs = unwrap(list(args)), unwrap(dict(kwargs))
    manual = _compat.current_mesh()[1]
    if not manual:
        jax.debug.print(fmt, *raw_args, **raw_kwargs)
        return
    leaves = jax.tree_util.tree_leaves((list(args), dict(kwargs)), is_leaf=is_typed)
    varying: set[str] = set()
    for leaf in leaves:
        if is_typed(leaf) or isinstance(leaf, jax.Array):
            t = typeof(leaf)
            varying |= t.varying | t.unreduced
    labelled = tuple(a for a in manual if a in varying)
    index = tuple(jax.lax.axis_index(a) for a in manual)

    def callback(idx: Any, *a: Any, **k: Any) -> None:
        at = {name: int(i) for name, i in zip(manual, idx, strict=True)}
        if any(at[name] != 0 for name in manual if name not in varying):
            return  # a copy of a line another device prints
        prefix = "[" + " ".join(f"{name}={at[name]}" for name in labelled) + "] " if labelled else ""
        line = prefix + fmt.format(*a, **k)
        with _PRINT_LOCK:  # the devices' callbacks run on concurrent host threads
            builtins.print(line, flush=True)

    jax.debug.callback(callback, index, *raw_args, **raw_kwargs)
