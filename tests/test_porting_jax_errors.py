"""Every JAX manual-axis error, explained: each message JAX raises (on the JAX version this leg
runs) is triggered by a raw program (`tests/_jax_error_cases.py`), translated by
`spmdtyped._errors.jax_messages` into its SPMD code, and reported by `infer` (as a violation, never an
exception), `typed_shard_map` (an SpmdTypeError at the user's line, JAX's error chained when
JAX's check fired first) and `st.shard_map`."""

from __future__ import annotations

import re

import _jax_error_cases as cases
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped._errors import jax_messages as _jax_errors

CASES = cases.CASES
IN = P("dp", "tp")


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 4), ("dp", "tp"))


@pytest.fixture(scope="module")
def x(mesh):
    return jax.device_put(jnp.arange(64.0).reshape(8, 8), NamedSharding(mesh, IN))


def _jax_error(f, out, mesh, x) -> BaseException:
    with pytest.raises(Exception) as ei:  # noqa: PT011 - JAX raises ValueError/TypeError/...
        jax.make_jaxpr(jax.shard_map(f, mesh=mesh, in_specs=IN, out_specs=out))(x)
    assert not isinstance(ei.value, st.SpmdTypeError)
    return ei.value


@pytest.mark.parametrize("name", CASES)
def test_jax_message_translated(name, mesh, x):
    f, out, code, _tool = CASES[name]
    jax_error = _jax_error(f, out, mesh, x)
    err = _jax_errors.translate(jax_error, "where")
    assert err is not None, f"untranslated JAX message: {jax_error}"
    assert err.code == code, (str(jax_error).splitlines()[0], err.code)
    assert err.jax_message == str(jax_error)
    assert err.fix and err.headline.startswith("where: ")
    if code not in ("SPMD401", "SPMD302"):  # JAX raises these at the shard_map / loop call
        assert err.file == cases.__file__
        assert re.search(r"\bdef \w+|lax\.|jnp\.|[+*/@]", open(cases.__file__).read().splitlines()[err.line - 1])


@pytest.mark.parametrize("name", CASES)
def test_infer_returns_it_as_a_violation(name, mesh, x):
    f, out, _code, tool = CASES[name]
    rep = st.adapters.infer(f, x, mesh=mesh, in_specs=IN, out_specs=out)
    assert not rep.ok
    v = rep.violations[0]
    assert isinstance(v, st.SpmdTypeError) and v.code == tool, str(v)
    assert v.file == cases.__file__


@pytest.mark.parametrize("name", CASES)
def test_typed_shard_map_raises_it_at_the_users_line(name, mesh, x):
    f, out, _code, tool = CASES[name]
    fn = st.adapters.typed_shard_map(f, mesh=mesh, in_specs=IN, out_specs=out)
    with pytest.raises(st.SpmdTypeError) as ei:
        fn(x)
    assert ei.value.code == tool, str(ei.value)
    assert ei.value.file == cases.__file__
    line = open(cases.__file__).read().splitlines()[ei.value.line - 1]
    assert line.strip(), line
    cause = ei.value.__cause__
    if cause is not None:  # JAX's check fired first: its error is chained, translated
        assert _jax_errors.translate(cause) is not None


def test_every_table_row_is_documented_and_distinct():
    doc = open(__file__.replace("tests/test_porting_jax_errors.py", "docs/porting.md")).read()
    for row in _jax_errors.TABLE:
        assert row.code in st._errors.REGISTRY
        assert re.search(row.pattern, row.example, re.DOTALL), row.pattern
        assert row.example.split(".")[0][:40] in doc, row.example
    assert len({r.pattern for r in _jax_errors.TABLE}) == len(_jax_errors.TABLE)


def test_cases_cover_each_message_this_jax_raises(mesh, x):
    """Each case triggers a different row of the table (no two cases test the same message),
    and the rows no case reaches are the ones JAX raises only elsewhere (Refs, in_specs of an
    Explicit mesh, custom primitives) or only on the other JAX version."""
    hit = {}
    for name, (f, out, _code, _tool) in CASES.items():
        text = str(_jax_error(f, out, mesh, x))
        row = next(r for r in _jax_errors.TABLE if re.search(r.pattern, text, re.DOTALL))
        hit.setdefault(row.pattern, name)
    assert len(hit) >= 12


def test_st_shard_map_translates_raw_jax_inside_a_typed_body(mesh, x):
    @st.shard_map(mesh=mesh, in_specs=IN, out_specs=P("dp"))
    def body(v):
        u = jax.lax.pcast(v.raw, "tp", to="unreduced")
        return jax.lax.psum(jnp.tanh(u), "tp")

    with pytest.raises(st.SpmdTypeError) as ei:
        body(x)
    assert ei.value.code == "SPMD202"
    assert ei.value.__cause__ is not None and not isinstance(ei.value.__cause__, st.SpmdTypeError)


def test_lax_dropin_translates_inside_its_calls(mesh, x):
    def f(v):
        return st.lax.psum(st.lax.pcast(v, "tp", to="unreduced"), ("dp", "tp"))

    with pytest.raises(st.SpmdTypeError) as ei:
        jax.make_jaxpr(jax.shard_map(f, mesh=mesh, in_specs=IN, out_specs=P()))(x)
    assert ei.value.code == "SPMD104"
