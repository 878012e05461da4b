"""Fuzz harness over the public API's arguments (issue 26): every call either succeeds or
raises an spmdtyped error with a code (`SpmdTypeError`, never SPMD901); never a raw exception
from inside spmdtyped or JAX.

hypothesis draws an API and its arguments from pools of valid and malformed values (axis
names and typos, ints, perms, cast targets, specs, meshes, functions and non-callables,
operands in every state). Bounded: `max_examples` per group, `deadline=None`, every body
traced (never compiled). Outcomes are counted in `COUNTS` (printed by the last test, and by
`python tests/test_fuzz_api.py`) for the issue's closing note.
"""

from __future__ import annotations

import collections
import os
import sys
from collections.abc import Callable
from typing import Any

if __name__ == "__main__":  # a script: 8 simulated devices before JAX is imported
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from jax.sharding import PartitionSpec as P

import spmdtyped as st

MAX_EXAMPLES = int(os.environ.get("SPMDTYPED_FUZZ_EXAMPLES", "120"))
#: count every outcome without failing on the first raw one (the script's discovery mode)
COLLECT = os.environ.get("SPMDTYPED_FUZZ_COLLECT") == "1"
SETTINGS = settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck), database=None)

#: outcome -> count; "ok", "SPMDxxx", "raw <Exception>" (the failures), per group too
COUNTS: collections.Counter[str] = collections.Counter()
RAW: list[str] = []

AXES: list[Any] = ["dp", "tp", ("dp", "tp"), ("tp",), "tq", "", 3, None, ["tp"], {"tp"},
                   ("tp", "tp"), b"tp", 1.5]
INTS: list[Any] = [0, 1, -1, 2, 3, 7, -9, True, 1.5, "0", None, (0,), [0, 1], np.int32(1)]
PERMS: list[Any] = [[(k, (k + 1) % 4) for k in range(4)], [(0, 1), (1, 0)], [(0, 9)], 5, [],
                    [(0, 1), (2, 1)], [[0, 1]], [(0,)], "ab", None, [(0.5, 1)], [1, 2, 3, 0],
                    [0, 1, 2, 3], (3, 2, 1, 0), [0, 0, 1, 2]]
TARGETS: list[Any] = ["varying", "reduced", "unreduced", "invarying", "bogus", None, 3]
BOOLS: list[Any] = [False, True, 0, 1, "yes", None]
STATES = ["raw", "I", "V:tp", "V:dp,tp", "U:tp", "R:tp", "scalar", "none", "str", "numpy",
          "list", "rank0"]


def _ok_fn(v: Any) -> Any:
    return v


def _sum_fn(v: Any) -> Any:
    return st.numpy.sum(v)


FNS: list[Any] = [_ok_fn, _sum_fn, None, 5, "f", st.numpy.tanh, [_ok_fn]]


def _operand(v: Any, kind: str) -> Any:
    """`v` (Invariant, inside the body) brought to `kind`, or a non-array."""
    if kind == "raw":
        return v.raw
    if kind == "I":
        return v
    if kind.startswith("V:"):
        return st.pvary(v, tuple(kind[2:].split(",")))
    if kind == "U:tp":
        return st.pcast(st.pvary(v, "tp"), "tp", to="unreduced")
    if kind == "R:tp":
        return st.pcast(v, "tp", to="reduced")
    return {"scalar": 2.0, "none": None, "str": "x", "numpy": np.ones((8, 4), np.float32),
            "list": [1.0, 2.0], "rank0": st.numpy.sum(v)}[kind]


def _typed(x: Any) -> Any:
    y = st.wrap(x)
    if not hasattr(y, "spmd_type"):  # a pytree (a list): not a typed value
        raise st.SpmdTypeError("not a typed value", code="SPMD509")
    return y


#: API name -> (argument strategies, call(x, *args)) run inside a shard_map body
BODY: dict[str, tuple[list[Any], Callable[..., Any]]] = {
    **{name: ([hs.sampled_from(AXES)], (lambda n: lambda x, a: getattr(st, n)(x, a))(name))
       for name in ("psum", "pmean", "pmax", "pmin", "pvary")},
    "ppermute": ([hs.sampled_from(AXES), hs.sampled_from(PERMS)],
                 lambda x, a, p: st.ppermute(x, a, p)),
    "pshuffle": ([hs.sampled_from(AXES), hs.sampled_from(PERMS)],
                 lambda x, a, p: st.pshuffle(x, a, p)),
    "all_gather": ([hs.sampled_from(AXES), hs.sampled_from(INTS), hs.sampled_from(BOOLS),
                    hs.sampled_from(TARGETS)],
                   lambda x, a, d, t, to: st.all_gather(x, a, axis=d, tiled=t, to=to)),
    "psum_scatter": ([hs.sampled_from(AXES), hs.sampled_from(INTS), hs.sampled_from(BOOLS)],
                     lambda x, a, d, t: st.psum_scatter(x, a, scatter_dimension=d, tiled=t)),
    "all_to_all": ([hs.sampled_from(AXES), hs.sampled_from(INTS), hs.sampled_from(INTS),
                    hs.sampled_from(BOOLS)],
                   lambda x, a, s, c, t: st.all_to_all(x, a, s, c, tiled=t)),
    "pcast": ([hs.sampled_from(AXES), hs.sampled_from(TARGETS)],
              lambda x, a, to: st.pcast(x, a, to=to)),
    "axis_index": ([hs.sampled_from(AXES)], lambda x, a: st.axis_index(a)),
    "axis_size": ([hs.sampled_from(AXES)], lambda x, a: st.axis_size(a)),
    "local": ([hs.sampled_from(AXES)], lambda x, a: st.local(x, a)),
    "wrap": ([], lambda x: st.wrap(x)),
    "typeof": ([], lambda x: st.typeof(x)),
    "unwrap": ([], lambda x: st.unwrap(x)),
    "cond": ([hs.sampled_from([True, 0, None, "p"]), hs.sampled_from(FNS), hs.sampled_from(FNS)],
             lambda x, p, f, g: st.cond(p, f, g, x)),
    "switch": ([hs.sampled_from([0, 1, 5, None]),
                hs.sampled_from([[_ok_fn, _ok_fn], [], [5], _ok_fn, None, [_ok_fn, "f"]])],
               lambda x, i, bs: st.switch(i, bs, x)),
    "grad": ([hs.sampled_from(FNS), hs.sampled_from(INTS)],
             lambda x, f, n: st.grad(f, argnums=n)(x)),
    "opaque": ([hs.sampled_from(FNS)], lambda x, f: st.opaque(f)(x)),
    # st.numpy / st.nn with arguments jax.numpy rejects (SPMD509 with JAX's message)
    **{f"st.numpy.{n}": ([hs.sampled_from(INTS + [(0, 1), (0, 0), 1.5, "a"])],
                         (lambda fn: lambda x, a: getattr(st.numpy, fn)(x, axis=a))(n))
       for n in ("sum", "mean", "max", "cumsum", "argmax")},
    "st.numpy.pad": ([hs.sampled_from(INTS)], lambda x, a: st.numpy.pad(x, a)),
    "st.numpy.reshape": ([hs.sampled_from(INTS + [(4, 8), (32,), (-1,)])],
                         lambda x, a: st.numpy.reshape(x, a)),
    "st.numpy.concatenate": ([hs.sampled_from(INTS)],
                             lambda x, a: st.numpy.concatenate([x, x], axis=a)),
    "st.numpy.roll": ([hs.sampled_from(INTS)], lambda x, a: st.numpy.roll(x, 1, axis=a)),
    "st.nn.softmax": ([hs.sampled_from(INTS)], lambda x, a: st.nn.softmax(x, axis=a)),
    "astype": ([hs.sampled_from([jnp.int32, "float16", "bogus", 5, None, bool])],
               # the method of a typed value (raw operands are wrapped first)
               lambda x, d: _typed(x).astype(d)),
    "fori_loop": ([hs.sampled_from(INTS), hs.sampled_from(FNS)],
                  lambda x, n, f: st.fori_loop(0, n, (lambda i, c: f(c)) if callable(f) else f, x)),
}


def _mesh() -> Any:
    return jax.make_mesh((2, 4), ("dp", "tp"))


def _record(group: str, fn: Callable[[], Any], context: str = "") -> str:
    try:
        fn()
        outcome = "ok"
    except st.SpmdTypeError as e:
        outcome = e.code
    except Exception as e:  # noqa: BLE001 - a raw error is what the harness looks for
        first = str(e).splitlines()[0][:160] if str(e) else ""
        outcome = f"raw {type(e).__name__}"
        RAW.append(f"{group}: {type(e).__name__}: {first}" + (f"  [{context}]" if context else ""))
    COUNTS["calls"] += 1
    COUNTS[outcome] += 1
    COUNTS[f"{group} {outcome}"] += 1
    return "ok" if COLLECT else outcome


@SETTINGS
@given(api=hs.sampled_from(sorted(BODY)), state=hs.sampled_from(STATES), data=hs.data())
def test_fuzz_body_calls(api: str, state: str, data: Any) -> None:
    strategies, call = BODY[api]
    args = [data.draw(s) for s in strategies]

    def body(v: Any) -> Any:
        call(_operand(v, state), *args)
        return jnp.zeros(())

    def run() -> None:
        jax.jit(st.shard_map(body, mesh=_mesh(), in_specs=P(), out_specs=P())).trace(
            jax.ShapeDtypeStruct((8, 4), jnp.float32))

    outcome = _record(api, run, f"state={state} args={args!r}")
    assert not outcome.startswith("raw") and outcome != "SPMD901", RAW[-1:] or outcome


SPECS: list[Any] = [P(), P("dp"), P("tp"), P(("dp", "tp")), P("tq"), P(1), P(None, "tp"),
                    P(unreduced={"tp"}), P(reduced={"tp"}), (P(),), (P(), P()), None, "dp", 3,
                    [P()]]
MESHES: list[Any] = ["mesh", "dp", None, 5, ("dp", "tp"), "abstract"]
AXIS_NAMES: list[Any] = [frozenset(), {"dp"}, {"tp"}, {"tq"}, "dp", ("dp", "tp"), 5, [3], None]


def _raw_fn(v: Any) -> Any:
    return jax.lax.psum(v, "tp") if not isinstance(v, (int, float)) else v


@SETTINGS
@given(api=hs.sampled_from(["st.shard_map", "typed_shard_map", "infer"]),
       fn=hs.sampled_from([*FNS, _raw_fn]), mesh=hs.sampled_from(MESHES),
       in_specs=hs.sampled_from(SPECS), out_specs=hs.sampled_from(SPECS),
       axis_names=hs.sampled_from(AXIS_NAMES), check_vma=hs.sampled_from([True, False]))
def test_fuzz_shard_map(api: str, fn: Any, mesh: Any, in_specs: Any, out_specs: Any,
                        axis_names: Any, check_vma: bool) -> None:
    m = {"mesh": _mesh(), "abstract": _mesh().abstract_mesh}.get(mesh, mesh) \
        if isinstance(mesh, str) else mesh
    arg = jax.ShapeDtypeStruct((8, 4), jnp.float32)

    def run() -> None:
        kw = {"mesh": m, "in_specs": in_specs, "out_specs": out_specs,
              "axis_names": axis_names, "check_vma": check_vma}
        if api == "infer":
            rep = st.adapters.infer(fn, jnp.ones((8, 4)), **kw)
            if rep.violations:
                raise rep.violations[0]
            return
        smap = st.shard_map if api == "st.shard_map" else st.adapters.typed_shard_map
        jax.jit(smap(fn, **kw)).trace(arg)

    context = f"fn={getattr(fn, '__name__', fn)!r} mesh={mesh!r} in_specs={in_specs!r} " \
              f"out_specs={out_specs!r} axis_names={axis_names!r} check_vma={check_vma}"
    outcome = _record(api, run, context)
    assert not outcome.startswith("raw") and outcome != "SPMD901", RAW[-1:] or outcome


@SETTINGS
@given(code=hs.sampled_from(["SPMD101", "spmd101", 101, "101", "reduced-operand", "SPMD999",
                             None, 3.5, True, "", ["SPMD101"], "SPMD103", "SPMD202"]),
       api=hs.sampled_from(["explain", "allow"]))
def test_fuzz_explain_and_allow(code: Any, api: str) -> None:
    def run() -> None:
        if api == "explain":
            st.explain(code)
        else:
            with st.allow(code):
                pass

    outcome = _record(api, run)
    assert not outcome.startswith("raw"), RAW[-1:] or outcome


def test_fuzz_counts() -> None:
    """The counts for the issue's closing note (`pytest -s` shows them)."""
    if not COUNTS:
        pytest.skip("run with the fuzz tests")
    print(report())


def report() -> str:
    lines = [f"fuzz calls: {COUNTS['calls']}"]
    totals = sorted((k, v) for k, v in COUNTS.items() if " " not in k and k != "calls")
    lines.append("outcomes: " + ", ".join(f"{k}={v}" for k, v in totals))
    raws = sorted((k, v) for k, v in COUNTS.items() if k.startswith("raw "))
    lines.append("raw: " + (", ".join(f"{k}={v}" for k, v in raws) or "none"))
    return "\n".join(lines)


if __name__ == "__main__":
    for t in (test_fuzz_body_calls, test_fuzz_shard_map, test_fuzz_explain_and_allow):
        try:
            t()
        except AssertionError as e:
            print(f"{t.__name__}: {e}")
    print(report())
    for r in sorted(set(RAW)):
        print("  ", r)
    sys.exit(1 if RAW else 0)
