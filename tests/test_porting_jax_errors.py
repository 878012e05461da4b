"""Every JAX manual-axis error, explained: each message JAX raises (on the JAX version this leg
runs) is triggered by a raw program (`tests/_jax_error_cases.py`), translated by
`spmdtyped._errors.jax_messages` into its SPMD code, and reported by `infer` (as a violation, never an
exception), `typed_shard_map` (an SpmdTypeError at the user's line, JAX's error chained when
JAX's check fired first), `st.adapters.checking()` around the unchanged `jax.shard_map` (the
same, out_specs errors included) and `st.shard_map` (the raw body inside a typed one)."""

from __future__ import annotations

import importlib
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


@pytest.mark.parametrize("name", CASES)
def test_checking_raises_it_around_the_unchanged_shard_map(name, mesh, x):
    f, out, _code, tool = CASES[name]
    shard_map = jax.shard_map
    with pytest.raises(st.SpmdTypeError) as ei:
        st.adapters.checking(jax.shard_map(f, mesh=mesh, in_specs=IN, out_specs=out))(x)
    assert ei.value.code == tool, str(ei.value)
    assert ei.value.file == cases.__file__
    assert open(cases.__file__).read().splitlines()[ei.value.line - 1].strip()
    assert jax.shard_map is shard_map  # nothing replaced
    cause = ei.value.__cause__
    if cause is not None and not isinstance(cause, st.SpmdTypeError):
        assert _jax_errors.translate(cause) is not None


@pytest.mark.parametrize("name", CASES)
def test_st_shard_map_raises_it_for_a_raw_body(name, mesh, x):
    f, out, code, _tool = CASES[name]

    def body(v):
        return f(v.raw)

    with pytest.raises(st.SpmdTypeError) as ei:
        st.shard_map(body, mesh=mesh, in_specs=IN, out_specs=out)(x)
    assert ei.value.code == code, str(ei.value)
    if code != "SPMD401":  # st.shard_map's own boundary check, at the shard_map call
        assert ei.value.file == cases.__file__
        assert _jax_errors.translate(ei.value.__cause__) is not None


def _varying_as_unreduced(x):
    return x


def _invariant_as_reduced(x):
    return jax.lax.psum(x, "tp")


def _unreduced_as_replicated(x):
    return jax.lax.pcast(x, "tp", to="unreduced")


def _reduced_as_replicated(x):
    return jax.lax.pcast(jax.lax.psum(x, "tp"), "tp", to="reduced")


#: outputs whose state differs from their out_spec's: JAX raises a ValueError (or, on jax 0.10,
#: accepts a Varying output under P(unreduced=...)); checking() reports each as SPMD401
OUT_SPEC_BUGS = {
    "varying_as_replicated": (cases.varying_output, P("dp")),
    "varying_as_unreduced": (_varying_as_unreduced, P("dp", unreduced={"tp"})),
    "invariant_as_unreduced": (_invariant_as_reduced, P("dp", unreduced={"tp"})),
    "invariant_as_reduced": (_invariant_as_reduced, P("dp", reduced={"tp"})),
    "unreduced_as_replicated": (_unreduced_as_replicated, P("dp")),
    "reduced_as_replicated": (_reduced_as_replicated, P("dp")),
}


def test_checking_places_a_boundary_error_at_the_body_while_gc_callbacks_run(mesh, x):
    """A gc callback runs wherever an allocation triggers a collection, JAX's frames included
    (hypothesis installs one): the boundary error is still at the body's `def` (CI, stop 23:
    a profile hook then took the callback for the body; the rejected call is now read from
    JAX's frame, `_tracebacks.shard_map_call`)."""
    import gc

    def on_gc(phase, info):
        return None

    f, out = OUT_SPEC_BUGS["invariant_as_unreduced"]
    old = gc.get_threshold()
    gc.callbacks.append(on_gc)
    gc.set_threshold(1, 1, 1)   # a collection on (nearly) every allocation
    try:
        with pytest.raises(st.SpmdTypeError) as ei:
            st.adapters.checking(jax.shard_map(f, mesh=mesh, in_specs=IN, out_specs=out))(x)
    finally:
        gc.set_threshold(*old)
        gc.callbacks.remove(on_gc)
    assert ei.value.code == "SPMD401", str(ei.value)
    assert (ei.value.file, ei.value.line) == (f.__code__.co_filename, f.__code__.co_firstlineno)


@pytest.mark.parametrize("name", OUT_SPEC_BUGS)
def test_checking_checks_every_out_spec(name, mesh, x):
    f, out = OUT_SPEC_BUGS[name]
    with pytest.raises(st.SpmdTypeError) as ei:
        st.adapters.checking(jax.shard_map(f, mesh=mesh, in_specs=IN, out_specs=out))(x)
    assert ei.value.code == "SPMD401", str(ei.value)
    assert ei.value.file == __file__ or ei.value.file == cases.__file__
    assert "def " in open(ei.value.file).read().splitlines()[ei.value.line - 1]
    # outside the block the program is JAX's again
    try:
        jax.make_jaxpr(jax.shard_map(f, mesh=mesh, in_specs=IN, out_specs=out))(x)
    except st.SpmdTypeError:
        raise AssertionError("jax.shard_map still checked after the block") from None
    except Exception:  # noqa: S110 - JAX's ValueError (jax 0.10 accepts varying_as_unreduced)
        pass


def test_checking_leaves_correct_programs_and_the_decorator_form_alone(mesh, x):
    def ok(v):
        return jax.lax.psum(v, "tp")

    shard_map = jax.shard_map
    want = jax.shard_map(ok, mesh=mesh, in_specs=IN, out_specs=P("dp"))(x)
    dec = jax.shard_map(mesh=mesh, in_specs=IN, out_specs=P("dp"))(ok)
    got = st.adapters.checking(jax.jit(dec))(x)
    typed = st.adapters.typed_shard_map(ok, mesh=mesh, in_specs=IN, out_specs=P("dp"))(x)
    assert (got == want).all() and (typed == want).all()
    assert jax.shard_map is shard_map


def test_scaling_an_unreduced_value_from_either_side(mesh, x):
    def left(v):
        return jax.lax.psum(2.0 * jax.lax.pcast(v, "tp", to="unreduced"), "tp")

    err = _jax_errors.translate(_jax_error(left, P("dp"), mesh, x))
    assert err is not None and err.code == "SPMD201"
    assert "LHS should be reduced" in err.jax_message


def test_unreduced_psum_scatter_of_a_varying_value():
    """JAX's `unreduced_psum_scatter` (the pullback of `all_gather(to="reduced")`) has no public
    name, and the public routes check the cotangent before it (`varying_cotangent`): its own
    messages, as JAX raises them on this leg, are SPMD404 too."""
    parallel = importlib.import_module("jax._src.lax.parallel")
    if not hasattr(parallel, "unreduced_psum_scatter"):
        pytest.skip(f"jax {jax.__version__} has no unreduced_psum_scatter")
    mesh = jax.make_mesh((2, 4), ("dp", "tp"))

    def f(v):
        return parallel.unreduced_psum_scatter(v, "tp", scatter_dimension=1, tiled=True)

    y = jax.ShapeDtypeStruct((8, 32), jnp.float32, sharding=NamedSharding(mesh, IN))
    with pytest.raises(Exception) as ei:  # noqa: PT011 - JAX's ValueError
        jax.make_jaxpr(jax.shard_map(f, mesh=mesh, in_specs=IN, out_specs=IN))(y)
    err = _jax_errors.translate(ei.value)
    assert err is not None and err.code == "SPMD404", str(ei.value)


def test_every_table_row_is_documented_and_distinct():
    doc = open(__file__.replace("tests/test_porting_jax_errors.py", "docs/porting.md")).read()
    for row in _jax_errors.TABLE:
        assert row.code in st._errors.REGISTRY
        assert re.search(row.pattern, row.example, re.DOTALL), row.pattern
        assert row.example.split(".")[0][:40] in doc, row.example
    assert len({(r.pattern, r.code) for r in _jax_errors.TABLE}) == len(_jax_errors.TABLE)
    # one message, two codes, only where JAX's message names neither state (the operands JAX
    # rejected tell: `reduced_cumsum` and `unreduced_cumsum` above)
    shared = {r.pattern for r in _jax_errors.TABLE
              if sum(o.pattern == r.pattern for o in _jax_errors.TABLE) > 1}
    assert shared == {r"unreduced/reduced rule for (?P<op>\w+) is not implemented"}


def test_cases_cover_each_message_this_jax_raises(mesh, x):
    """Each case triggers a different row of the table (no two cases test the same message),
    and the rows no case reaches are the ones JAX raises only elsewhere (Refs, in_specs of an
    Explicit mesh, custom primitives) or only on the other JAX version."""
    hit = {}
    for name, (f, out, _code, _tool) in CASES.items():
        text = str(_jax_error(f, out, mesh, x))
        row = next(r for r in _jax_errors.TABLE if re.search(r.pattern, text, re.DOTALL))
        hit.setdefault(row.pattern, name)
    assert len(hit) >= 15


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


def test_every_row_formats():
    """Each row's headline and fix format with the primitive's name (a brace in a fix once
    crashed `translate` on JAX's reduced-out_spec message)."""
    for row in _jax_errors.TABLE:
        assert row.headline.format(op="psum") and row.fix.format(op="psum")


@pytest.mark.skipif("reduced_cumsum" not in CASES, reason="jax 0.12.1's message")
@pytest.mark.parametrize("filtering", ["off", "remove_frames", "quiet_remove_frames"])
@pytest.mark.parametrize(("name", "code"), [("reduced_cumsum", "SPMD203"),
                                            ("unreduced_cumsum", "SPMD202")])
def test_no_rule_message_takes_the_operands_state_under_any_traceback_filtering(
        name, code, filtering, mesh, x):
    """JAX's `unreduced/reduced rule for cumsum is not implemented` names neither state: the
    code comes from the operands JAX rejected, whether its traceback filtering kept JAX's
    frame (off, and the unfiltered copy `remove_frames` chains) or only the `jnp` function's
    (the default)."""
    from jax._src import config as jax_config  # the option's context manager (thread-local)

    f, out, _code, _tool = CASES[name]
    with jax_config.traceback_filtering(filtering):
        jax_error = _jax_error(f, out, mesh, x)
    err = _jax_errors.translate(jax_error, "where")
    assert err is not None and err.code == code, err
    assert ("pcast" if code == "SPMD203" else "psum") in err.fix
