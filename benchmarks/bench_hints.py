"""Runtime hint check cost per argument: `isinstance(x, st.Varying["dp"])` and a `@beartype`
function with spmdtyped hints, on a typed value and on a raw JAX tracer inside shard_map.

Everything is timed inside one `st.shard_map` trace, where values are tracers (as in a real
program). Per argument: (checked call - unannotated call) / arguments; the ratio is the
checked call over the same unannotated call. A 4-argument function is used, so the wrapper's
fixed cost is shared the way it is in real code.
"""

from __future__ import annotations

import timeit
from dataclasses import dataclass
from typing import Any

ARGS = 4


@dataclass
class HintRow:
    check: str          # "isinstance" / "beartype"
    value: str          # "typed value" / "raw tracer"
    per_arg_us: float   # extra microseconds per checked argument
    call_us: float      # checked call, microseconds
    plain_us: float     # unannotated call, microseconds

    @property
    def ratio(self) -> float:
        return self.call_us / self.plain_us


def _best_us(fn: Any, number: int, repeat: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def run(number: int = 20000, repeat: int = 7) -> list[HintRow]:
    import jax
    import jax.numpy as jnp
    from beartype import beartype
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import spmdtyped as st
    from spmdtyped import Varying

    H = Varying["dp"]

    def plain(a, b, c, d):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
        return a

    def by_isinstance(a, b, c, d):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
        if not (isinstance(a, H) and isinstance(b, H) and isinstance(c, H) and isinstance(d, H)):
            raise TypeError("not Varying['dp']")
        return a

    @beartype
    def by_beartype(a: Varying["dp"], b: Varying["dp"], c: Varying["dp"],  # noqa: F821
                    d: Varying["dp"]) -> Any:  # noqa: F821
        return a

    rows: list[HintRow] = []

    def body(typed: Any) -> Any:
        raw = typed.raw                            # the JAX tracer; `typed`: class Varying["dp"]
        assert type(typed) is H and isinstance(raw, H) and not isinstance(raw, st.Invariant)
        for value_name, v in (("typed value", typed), ("raw tracer", raw)):
            base = _best_us(lambda v=v: plain(v, v, v, v), number, repeat)
            for check, fn in (("isinstance", by_isinstance), ("beartype", by_beartype)):
                t = _best_us(lambda fn=fn, v=v: fn(v, v, v, v), number, repeat)
                rows.append(HintRow(check, value_name, max(t - base, 0.0) / ARGS, t, base))
        return typed

    mesh = jax.make_mesh((2, 4), ("dp", "tp"))
    x = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P("dp")))
    jax.jit(st.shard_map(body, mesh=mesh, in_specs=P("dp"), out_specs=P("dp"))).trace(x)
    return rows


if __name__ == "__main__":
    import os
    import sys
    from pathlib import Path

    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    for r in run():
        print(f"{r.check:10s} {r.value:12s} {r.per_arg_us:6.2f} us/arg  call {r.call_us:6.2f} us  "
              f"plain {r.plain_us:6.2f} us  ratio {r.ratio:5.1f}x")
