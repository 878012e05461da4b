"""Adversarial catalogue of bad inputs (issue 12): each user mistake is an `SpmdTypeError` with a
code, never SPMD901, a raw Python error or a raw JAX error. One case per mistake, grouped by
where it happens (inside the shard_map body, at the boundary, outside).

`python tests/test_bad_inputs.py` prints the count (clean errors / total) for the issue's
closing note.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

if __name__ == "__main__":  # a script: 8 simulated devices before JAX is imported
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import spmdtyped as st
import spmdtyped.numpy as snp
from spmdtyped import Invariant, Varying

X = jnp.arange(32.0).reshape(8, 4) / 7.0
PERM = [(k, (k + 1) % 4) for k in range(4)]


def _mesh() -> Any:
    return jax.make_mesh((2, 4), ("dp", "tp"))


def V(v: Any) -> Any:
    return st.pvary(v, "tp")


def U(v: Any) -> Any:
    return st.pcast(V(v), "tp", to="unreduced")


def R(v: Any) -> Any:
    return st.pcast(v, "tp", to="reduced")


#: (case, expected code, body run inside `st.shard_map(in_specs=P(), out_specs=P())`)
BODY: list[tuple[str, str, Callable[[Any], Any]]] = [
    ("psum of an Invariant value", "SPMD103", lambda v: st.psum(v, "tp")),
    ("psum of a Reduced value", "SPMD101", lambda v: st.psum(R(v), "tp")),
    ("unknown axis", "SPMD501", lambda v: st.psum(V(v), "tq")),
    ("axes as a list", "SPMD502", lambda v: st.psum(V(v), ["tp"])),
    ("axes as a set", "SPMD502", lambda v: st.psum(V(v), {"tp"})),
    ("repeated axes", "SPMD502", lambda v: st.psum(V(v), ("tp", "tp"))),
    ("axis as an int", "SPMD502", lambda v: st.psum(V(v), 3)),
    ("unknown cast target", "SPMD505", lambda v: st.pcast(v, "tp", to="bogus")),
    ("cast Varying to Reduced", "SPMD301", lambda v: st.pcast(V(v), "tp", to="reduced")),
    ("ppermute of Unreduced", "SPMD102", lambda v: st.ppermute(U(v), "tp", PERM)),
    ("all_gather of Reduced", "SPMD101", lambda v: st.all_gather(R(v), "tp")),
    ("all_to_all of Invariant", "SPMD103", lambda v: st.all_to_all(v, "tp", 0, 0, tiled=True)),
    ("psum_scatter of Reduced", "SPMD101", lambda v: st.psum_scatter(R(v), "tp", tiled=True)),
    ("axis_index of an unknown axis", "SPMD501", lambda v: st.axis_index("tq")),
    ("tanh of Unreduced", "SPMD202", lambda v: st.psum(snp.tanh(U(v)), "tp")),
    ("Unreduced + Varying", "SPMD201", lambda v: st.psum(U(v) + V(v), "tp")),
    ("Reduced + Invariant array", "SPMD203", lambda v: R(v) + v),
    ("Unreduced / 0.0", "SPMD202", lambda v: st.psum(U(v) / 0.0, "tp")),
    ("Unreduced ** 2", "SPMD202", lambda v: st.psum(U(v) ** 2, "tp")),
    ("Unreduced @ Invariant", "SPMD201", lambda v: st.psum(U(v) @ v.T, "tp")),
    ("pad(constant_values=5) of Unreduced", "SPMD202",
     lambda v: st.psum(snp.pad(U(v), 1, constant_values=5.0), "tp")),
    ("pad(mode='maximum') of Unreduced", "SPMD202",
     lambda v: st.psum(snp.pad(U(v), 1, mode="maximum"), "tp")),
    ("pad(mode='linear_ramp') of Unreduced", "SPMD202",
     lambda v: st.psum(snp.pad(U(v), 1, mode="linear_ramp"), "tp")),
    ("pad(mode='mean') of Reduced", "SPMD203", lambda v: snp.pad(R(v), 1, mode="mean")),
    ("astype(int32) of Unreduced", "SPMD202", lambda v: st.psum(U(v).astype(jnp.int32), "tp")),
    ("astype(bool) of Unreduced", "SPMD202", lambda v: st.psum(U(v).astype(jnp.bool_), "tp")),
    ("sum(dtype=int32) of Unreduced", "SPMD202",
     lambda v: st.psum(snp.sum(U(v), dtype=jnp.int32), "tp")),
    ("sum(initial=1) of Unreduced", "SPMD202", lambda v: st.psum(snp.sum(U(v), initial=1.0), "tp")),
    ("sum(initial=1) of Reduced", "SPMD203", lambda v: snp.sum(R(v), initial=1.0)),
    ("cumsum of Unreduced", "SPMD202", lambda v: st.psum(snp.cumsum(U(v), axis=0), "tp")),
    ("relu of Reduced", "SPMD203", lambda v: st.nn.relu(R(v))),
    ("softmax of Unreduced", "SPMD202", lambda v: st.psum(st.nn.softmax(U(v)), "tp")),
    (".at[].set of Unreduced", "SPMD202", lambda v: st.psum(U(v).at[0].set(1.0), "tp")),
    ("roll of Unreduced by a varying shift", "SPMD201",
     lambda v: st.psum(snp.roll(U(v), st.axis_index("tp"), axis=0), "tp")),
    ("pad of Invariant with an Unreduced constant", "SPMD202",
     lambda v: snp.pad(v, 1, constant_values=U(v)[0, 0])),
    ("comparison of Unreduced", "SPMD202", lambda v: st.psum(snp.where(U(v) > 0, 1.0, 0.0), "tp")),
    ("wrap with a state JAX disagrees with", "SPMD504",
     lambda v: st.wrap(v.raw, st.SpmdType(varying={"tp"}))),
    ("wrap with a state that is not an SpmdType", "SPMD504", lambda v: st.wrap(v.raw, "varying")),
    ("custom_op requires a misspelled state", "SPMD507",
     lambda v: st.custom_op(lambda a: a, requires={"tp": "varyin"})(v)),
    ("custom_op requires as a list", "SPMD507", lambda v: st.custom_op(lambda a: a, requires=["tp"])),
    ("custom_op argument in the wrong state", "SPMD107",
     lambda v: st.custom_op(lambda a: a, requires={"tp": "varying"})(v)),
    ("opaque function of Unreduced", "SPMD202",
     lambda v: st.psum(st.opaque(jnp.tanh)(U(v)), "tp")),
    ("loop carry changes state", "SPMD302",
     lambda v: st.fori_loop(0, 2, lambda i, c: st.psum(c, "tp"), U(v))),
    ("psum over a vmap axis under check_vma", "SPMD503",
     lambda v: jax.vmap(lambda r: st.psum(r, "rows"), axis_name="rows")(V(v))),
    ("grad of an Unreduced loss", "SPMD405",
     lambda v: st.grad(lambda w: st.numpy.sum(U(w)))(v)),
]


def _mlp(x: Varying["dp"]) -> Invariant:
    return st.psum(x, "dp")


def _hinted_wrong(x: Varying["dp"]) -> Varying["dp"]:
    return x


#: (case, expected code, call) at the shard_map boundary or outside any shard_map
OUTSIDE: list[tuple[str, str, Callable[[], Any]]] = [
    ("Varying output through P()", "SPMD401",
     lambda: jax.jit(st.shard_map(lambda v: V(v), mesh=_mesh(), in_specs=P(), out_specs=P()))(X)),
    ("Varying output through P() with check_vma=False", "SPMD401",
     lambda: jax.jit(st.shard_map(lambda v: V(v), mesh=_mesh(), in_specs=P(), out_specs=P(),
                                  check_vma=False))(X)),
    ("in_specs with two entries for one argument", "SPMD402",
     lambda: st.shard_map(lambda v: v, mesh=_mesh(), in_specs=(P(), P()), out_specs=P())(X)),
    ("in_specs against the parameter hint", "SPMD403",
     lambda: jax.jit(st.shard_map(_mlp, mesh=_mesh(), in_specs=(P("tp"),), out_specs=P()))(X)),
    ("out_specs against the return hint", "SPMD401",
     lambda: jax.jit(st.shard_map(_hinted_wrong, mesh=_mesh(), in_specs=(P("dp"),),
                                  out_specs=P()))(X)),
    ("unknown axis in axis_names", "SPMD501",
     lambda: st.shard_map(lambda v: v, mesh=_mesh(), in_specs=P(), out_specs=P(),
                          axis_names={"tq"})),
    ("unknown axis in out_specs", "SPMD501",
     lambda: st.shard_map(lambda v: v, mesh=_mesh(), in_specs=P(), out_specs=P("tq"))),
    ("psum outside shard_map", "SPMD506", lambda: st.psum(X, "tp")),
    ("explain an unknown code", "SPMD508", lambda: st.explain("SPMD999")),
    ("explain something that is not a code", "SPMD508", lambda: st.explain(None)),  # type: ignore[arg-type]
    ("allow a code that is not strict", "SPMD508", lambda: st.allow("SPMD501").__enter__()),
    ("typeof of a string", "SPMD504", lambda: st.typeof("hello")),
    ("a hint with a non-string axis", "SPMD504", lambda: st.Varying[3]),
]


def _outcome(fn: Callable[[], Any]) -> tuple[str, str]:
    try:
        fn()
    except st.SpmdTypeError as e:
        return ("clean" if e.code != "SPMD901" else "SPMD901"), e.code
    except Exception as e:  # noqa: BLE001 - a raw error is what this catalogue looks for
        return "raw", f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    return "accepted", ""


def _in_body(body: Callable[[Any], Any]) -> Callable[[], Any]:
    return lambda: jax.jit(st.shard_map(body, mesh=_mesh(), in_specs=P(), out_specs=P())).trace(X)


def all_cases() -> list[tuple[str, str, Callable[[], Any]]]:
    return [(c, code, _in_body(b)) for c, code, b in BODY] + OUTSIDE


@pytest.mark.parametrize("case", [c for c, _code, _fn in all_cases()])
def test_bad_input_is_a_clean_error_with_its_code(case: str) -> None:
    code, fn = next((code, fn) for c, code, fn in all_cases() if c == case)
    kind, got = _outcome(fn)
    assert (kind, got) == ("clean", code), f"{case}: {kind} {got}"


if __name__ == "__main__":
    results = [(c, code, *_outcome(fn)) for c, code, fn in all_cases()]
    clean = [r for r in results if r[2] == "clean"]
    print(f"bad inputs giving a clean error: {len(clean)} / {len(results)}")
    for c, code, kind, got in results:
        if kind != "clean" or got != code:
            print(f"  {c}: expected {code}, got {kind} {got}")
    sys.exit(0 if len(clean) == len(results) else 1)
