"""Reliability (issue 26): no silently wrong result, no crash, no raw error from bad input.

- the adapters' jaxpr walk reads the argument-dependent linearity of `pad` and `astype` from
  the rule `st.*` applies (`_rules.primitive_rule` -> `argument_rule`), and what it accepts
  computes the single-device truth;
- typed values behave like `jax.Array` for `==`/`!=` with any object, `format`, `in`,
  `weakref`, `pickle` / `copy.deepcopy` (every state and hint class, by its state), and
  `jax.device_get`; states and refinements pickled in another process (another string hash
  seed) hash as equal ones built here (both cache their hash);
- `__all__` is a literal list;
- SPMD101's first fix keeps the numbers its `before` meant.

The SPMD509 / SPMD409 / SPMD401 cases of bad arguments are in `tests/test_errors.py`
(`BAD_ARGUMENTS`), the fuzz harness in `tests/test_fuzz_api.py`.
"""

from __future__ import annotations

import ast
import copy
import pickle
import weakref
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import _compat, _rules

X = jnp.full((4, 4), 1.25, jnp.float32)


def _u(x: Any) -> Any:
    """Unreduced over tp: each of the 4 devices holds x, the true value is 4 * x."""
    return jax.lax.pcast(jax.lax.pcast(x, "tp", to="varying"), "tp", to="unreduced")


# ------------------------------------------------------------- the walk reads the arguments


REJECTED = {
    "pad(constant_values=5)": lambda x: jax.lax.psum(jnp.pad(_u(x), 1, constant_values=5.0), "tp"),
    "pad(constant_values=x[0, 0])":
        lambda x: jax.lax.psum(jnp.pad(_u(x), 1, constant_values=x[0, 0]), "tp"),
    "astype(int32)": lambda x: jax.lax.psum(_u(x).astype(jnp.int32), "tp"),
    "astype(bool)": lambda x: jax.lax.psum(_u(x).astype(jnp.bool_), "tp"),
    "sum(dtype=int32)": lambda x: jax.lax.psum(jnp.sum(_u(x), dtype=jnp.int32), "tp"),
}

ACCEPTED = {
    "pad()": (lambda x: jax.lax.psum(jnp.pad(_u(x), 1), "tp"), lambda g: np.pad(4 * g, 1)),
    "pad(mode='edge')": (lambda x: jax.lax.psum(jnp.pad(_u(x), 1, mode="edge"), "tp"),
                         lambda g: np.pad(4 * g, 1, mode="edge")),
    "astype(float16)": (lambda x: jax.lax.psum(_u(x).astype(jnp.float16), "tp"),
                        lambda g: (4 * g).astype(np.float16)),
    "astype(int32) of a Varying value": (
        lambda x: jax.lax.psum(jax.lax.pcast(x, "tp", to="varying").astype(jnp.int32), "tp"),
        lambda g: 4 * g.astype(np.int32)),
}


#: jax 0.12.1 rejects jnp.pad of an Unreduced value itself (its zero constant is Invariant):
#: spmdtyped reports JAX's error, translated
PAD_REJECTED_BY_JAX = _compat.FEATURES.pad_value_state
if PAD_REJECTED_BY_JAX:
    REJECTED["pad()"] = ACCEPTED.pop("pad()")[0]


@pytest.mark.parametrize("case", sorted(REJECTED))
def test_typed_shard_map_rejects_what_st_rejects(mesh_dp_tp: Any, case: str) -> None:
    f = st.adapters.typed_shard_map(REJECTED[case], mesh=mesh_dp_tp, in_specs=P(), out_specs=P())
    with pytest.raises(st.SpmdTypeError) as info:
        f(X)
    assert info.value.code == "SPMD202", str(info.value)
    if PAD_REJECTED_BY_JAX and case.startswith("pad"):
        assert "padding value" in str(info.value)
    else:
        assert "not linear" in str(info.value) and "Unreduced on ['tp']" in str(info.value)
    rep = st.adapters.infer(REJECTED[case], X, mesh=mesh_dp_tp, in_specs=P(), out_specs=P())
    assert [v.code for v in rep.violations] == ["SPMD202"]


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_typed_shard_map_accepts_the_linear_forms_with_the_true_result(mesh_dp_tp: Any,
                                                                        case: str) -> None:
    fn, reference = ACCEPTED[case]
    out = st.adapters.typed_shard_map(fn, mesh=mesh_dp_tp, in_specs=P(), out_specs=P())(X)
    np.testing.assert_allclose(np.asarray(out, np.float64),
                               np.asarray(reference(np.asarray(X)), np.float64))


def test_primitive_rule_is_argument_rule() -> None:
    """One source: the walk's row for a primitive is the row `st.*` picks for the same call."""
    assert _rules.primitive_rule("pad", {}, ["x", 0.0]) == _rules.argument_rule(
        "pad", {"constant_values": 0.0})
    assert _rules.primitive_rule("pad", {}, ["x", 5.0]) == _rules.argument_rule(
        "pad", {"constant_values": 5.0}) == "pad_affine"
    assert _rules.primitive_rule("pad", {}, ["x", _rules.UNKNOWN]) == "pad_affine"  # strict
    for to, src in [("int32", "float32"), ("bool", "int32"), ("float16", "float32"),
                    ("int8", "int32")]:
        assert _rules.primitive_rule("convert_element_type", {"new_dtype": to}, ["x"], src) \
            == _rules.argument_rule("astype", {"dtype": to}, src)
    assert _rules.argument_rule("sum", {"dtype": "bool"}, _rules.UNKNOWN) == "sum_nonlinear"


# ------------------------------------------------------------------------------ protocols


def _values() -> list[Any]:
    """A concrete typed value of every state (outside shard_map a value of any state can be
    built by its class), refined ones included."""
    raw = jnp.arange(6.0).reshape(2, 3)
    kinds = [st.Invariant, st.Varying["dp"], st.Varying["dp", "tp"], st.Unreduced["tp"],
             st.Reduced["tp"], st.Typed[st.Varying["dp"], st.Reduced["tp"]],
             st.Typed[st.Varying["dp"], st.Unreduced["tp"]]]
    return [k(raw) for k in kinds]


HINTS = [st.SArray, st.Invariant, st.Varying, st.Unreduced, st.Reduced, st.Typed, st.Shard,
         st.Partial, st.Rep, st.Varying["dp"], st.Varying["dp", "tp"], st.Unreduced["tp"],
         st.Reduced["tp"], st.Typed[st.Varying["dp"], st.Reduced["tp"]], st.Shard["tp", -1],
         st.Partial["tp"], st.Rep["dp"], st.Typed[st.Shard["dp", 0], st.Reduced["tp"]]]


@pytest.mark.parametrize("hint", HINTS, ids=[getattr(h, "__qualname__", str(h)) for h in HINTS])
def test_hint_classes_pickle_and_copy_by_name(hint: Any) -> None:
    assert pickle.loads(pickle.dumps(hint)) is hint
    assert copy.deepcopy(hint) is hint and copy.copy(hint) is hint


@pytest.mark.parametrize("k", range(7))
def test_every_state_round_trips_through_pickle_deepcopy_and_weakref(k: int) -> None:
    x = _values()[k]
    for y in (pickle.loads(pickle.dumps(x)), copy.deepcopy(x), copy.copy(x)):
        assert type(y) is type(x) and st.typeof(y) == st.typeof(x)
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
    ref = weakref.ref(x)
    assert ref() is x


def test_a_refined_value_keeps_its_refinement_through_pickle(mesh_dp_tp: Any) -> None:
    got: dict[str, Any] = {}

    def body(v: Any) -> Any:
        got["refinement"] = v.refinement
        got["pickled"] = pickle.loads(pickle.dumps(v.refinement))
        return v

    a = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh_dp_tp, P("dp")))
    st.shard_map(body, mesh=mesh_dp_tp, in_specs=P("dp"), out_specs=P("dp"))(a)
    assert got["pickled"] == got["refinement"] and got["refinement"]


_PICKLED_IN_ANOTHER_PROCESS = """
import base64, pickle, sys
from spmdtyped import _rules
from spmdtyped._rules.refine import PARTIAL, REP, Refinement, Shard
t = _rules.SpmdType({"dp", "tp", "sp"}, {"ep"})
r = Refinement.of({"dp": Shard(-1), "tp": PARTIAL, "sp": REP})
hash(t), hash(r)   # (hashed there first: a cached hash must not travel)
sys.stdout.write(base64.b64encode(pickle.dumps((t, r))).decode())
"""


def test_states_and_refinements_pickled_in_another_process_hash_as_here() -> None:
    """`SpmdType` and `Refinement` cache their hash; a string's hash (and so a set of axis
    names') differs from process to process, so an unpickled one must hash as an equal one
    built here (the state classes' cache and every memo look them up by hash)."""
    import base64
    import os
    import subprocess
    import sys

    from spmdtyped._rules.refine import PARTIAL, REP, Refinement, Shard
    from spmdtyped._typed.hints import state_class

    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", _PICKLED_IN_ANOTHER_PROCESS], env=env,
                         check=True, capture_output=True, text=True).stdout
    t, r = pickle.loads(base64.b64decode(out))
    here_t = _rules.SpmdType({"dp", "tp", "sp"}, {"ep"})
    here_r = Refinement.of({"dp": Shard(-1), "tp": PARTIAL, "sp": REP})
    assert t == here_t and hash(t) == hash(here_t)
    assert r == here_r and hash(r) == hash(here_r)
    assert {here_t: 1}[t] == 1 and {here_r: 1}[r] == 1
    assert state_class(t) is state_class(here_t)


def test_equality_with_any_object_is_jax_arrays() -> None:
    x = st.wrap(jnp.ones((2, 2)))
    raw = x.raw
    assert (x == None) is (raw == None) is False  # noqa: E711 - the comparison under test
    assert (x != None) is (raw != None) is True  # noqa: E711
    assert (x == "a") is False and (x != object()) is True
    with pytest.raises(TypeError, match="unsupported operand"):
        x + "a"  # noqa: B018 - as jax.Array: Python's TypeError, not one from inside spmdtyped
    assert bool((x == 1.0).raw.all())  # a number still compares elementwise


def test_format_contains_and_device_get_are_jax_arrays() -> None:
    x = st.wrap(jnp.arange(4.0))
    assert format(x[1], ".2f") == format(x.raw[1], ".2f") == "1.00"
    assert f"{x[2]:.1f}" == "2.0" and format(x, "") == str(x)
    assert (2.0 in x) is (2.0 in x.raw) is True and (7.0 in x) is False
    with pytest.raises(ValueError, match="one-dimensional"):
        1.0 in st.wrap(jnp.ones((2, 2)))  # noqa: B015 - jax.Array's own error
    host = jax.device_get(x)
    assert st.typeof(host) == st.typeof(x)
    np.testing.assert_array_equal(np.asarray(host), np.asarray(x.raw))


# ------------------------------------------------------------------------------- __all__


def test_all_is_a_literal_list_of_the_package_names() -> None:
    init = Path(st.__file__).read_text()
    tree = ast.parse(init)
    node = next(n for n in tree.body if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets))
    assert isinstance(node.value, ast.List), "__all__ must be a literal list (mypy reads it)"
    names = [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
    assert len(names) == len(node.value.elts) and names == sorted(set(names)) == st.__all__
    for n in names:
        getattr(st, n)  # every name resolves (lazily for the JAX-facing ones)
    from spmdtyped import _surface

    assert set(_surface.COLLECTIVE_NAMES) <= set(names)


# ------------------------------------------------------------- error pages keep the numbers


def test_spmd101_first_fix_computes_what_before_meant(mesh_dp_tp: Any) -> None:
    """`before` gathers a ZeRO shard and psums it again: what it meant is the gathered w
    (one sum). The page's `after` and the message's first fix give w; the pcast route that
    the page lists second gives n * w, and both say so."""
    page = st.explain("SPMD101")
    assert "changes the numbers" in page and "n·x" in page
    w = jnp.arange(8.0)
    ws = jax.device_put(w, NamedSharding(mesh_dp_tp, P("dp")))

    def run(source: str) -> np.ndarray:
        def body(w_shard: Any) -> Any:
            ns: dict[str, Any] = {"st": st, "w_shard": w_shard}
            exec(source, ns)  # noqa: S102 - the page's own code
            # each device's y as one row (pcast Reduced -> Varying is free and keeps values)
            y = ns["y"]
            return (st.pcast(y, "dp", to="varying") if st.typeof(y).reduced else y)[None]

        out = st.shard_map(body, mesh=mesh_dp_tp, in_specs=P("dp"), out_specs=P("dp"))(ws)
        return np.asarray(out)

    after = st._errors.REGISTRY["SPMD101"].after
    full = np.asarray(w).reshape(2, 4)  # all_gather (not tiled) stacks the 2 shards
    np.testing.assert_allclose(run(after), np.stack([full, full]))  # every device: w, as meant
    pcast_route = after.replace("y = w ", 'y = st.psum(st.pcast(w, "dp", to="varying"), "dp") ')
    assert pcast_route != after
    np.testing.assert_allclose(run(pcast_route), np.stack([2 * full, 2 * full]))  # n·w, as the page says
    with pytest.raises(st.SpmdTypeError) as info:
        jax.jit(st.shard_map(lambda v: st.psum(st.all_gather(v, "dp", to="reduced"), "dp"),
                             mesh=mesh_dp_tp, in_specs=P("dp"), out_specs=P())).trace(ws)
    assert info.value.fix is not None and info.value.fix.startswith("drop the st.psum")
    assert "changes the numbers" in info.value.fix
