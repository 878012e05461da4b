"""`st.adapters`: typed_shard_map, infer (the jaxpr walk), the infer CLI and the port codemod."""

from __future__ import annotations

import inspect
import pathlib
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import sds
from jax import lax
from jax.lax import psum as imported_psum
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import _compat
from spmdtyped._cli import args as _cli_args
from spmdtyped._cli import infer as _cli
from spmdtyped._cli import port as _port_cli
from spmdtyped.adapters._port import codemod as _codemod

PORTING = pathlib.Path(__file__).parent / "porting"


def line_of(fn, fragment):
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if fragment in line)


# ------------------------------------------------------------------- infer: the jaxpr walk


def _u(x):
    return lax.pcast(x, "dp", to="unreduced")


def in_jit(x):
    return jax.jit(lambda v: jnp.cumsum(_u(v)))(x)  # HERE


def in_scan(x):
    _, ys = lax.scan(lambda c, _: (c, jnp.cumsum(_u(x))), 0.0, None, length=1)  # HERE
    return ys[0]


def in_while(x):
    _, y = lax.while_loop(lambda c: c[0] < 1,
                          lambda c: (c[0] + 1, jnp.cumsum(_u(x))), (0, jnp.zeros(4)))  # HERE
    return y


def in_cond(x):
    return lax.cond(True, lambda: jnp.cumsum(_u(x)), lambda: jnp.zeros(4))  # HERE


def in_checkpoint(x):
    return jax.checkpoint(lambda v: jnp.cumsum(_u(v)))(x)  # HERE


@jax.custom_jvp
def _cj(v):
    return jnp.cumsum(_u(v))  # HERE


_cj.defjvp(lambda p, t: (_cj(p[0]), t[0]))


def in_custom_jvp(x):
    return _cj(x)


@jax.custom_vjp
def _cv(v):
    return jnp.cumsum(_u(v))  # HERE


_cv.defvjp(lambda v: (_cv(v), None), lambda _, g: (g,))


def in_custom_vjp(x):
    return _cv(x)


def in_pow(x):
    return _u(x) ** 2  # HERE


@pytest.mark.parametrize("fn,where", [
    (in_jit, in_jit), (in_scan, in_scan), (in_while, in_while), (in_cond, in_cond),
    (in_checkpoint, in_checkpoint), (in_custom_jvp, _cj), (in_custom_vjp, _cv), (in_pow, in_pow),
])
def test_infer_walks_nested_jaxprs(mesh_dp_tp, fn, where):
    """cumsum / ** of an Unreduced value: JAX drops the state (wrong numbers); found at any
    depth of jit/scan/while/cond/remat/custom_jvp/custom_vjp. (jax 0.12.1 rejects them itself:
    its error, translated, at the same line.)"""
    x = sds(mesh_dp_tp, (8,), P("dp"))
    if not _compat.FEATURES.no_rule_rejects:  # JAX: ok
        jax.make_jaxpr(jax.shard_map(fn, mesh=mesh_dp_tp, in_specs=P("dp"), out_specs=P()))(x)
    rep = st.adapters.infer(fn, x, mesh=mesh_dp_tp, in_specs=(P("dp"),), out_specs=P())
    assert not rep.ok
    v = rep.violations[0]
    assert v.code == "SPMD202" and v.line == line_of(where, "# HERE"), str(v)
    assert "Unreduced" in str(v) and v.source.endswith(f"test_adapters.py:{v.line}")


def test_explicit_pvary_is_the_opt_out(mesh_dp_tp):
    def f(x):
        return lax.psum(lax.pcast(x, "tp", to="varying"), "tp")  # n * x, on purpose

    rep = st.adapters.infer(f, sds(mesh_dp_tp, (8,), P("dp")), mesh=mesh_dp_tp, in_specs=(P("dp"),),
                            out_specs=P("dp"))
    assert rep.ok and rep.mismatches == []


def test_infer_double_psum_through_imported_name(mesh_dp_tp):
    def f(x):
        y = imported_psum(x, "dp")
        return imported_psum(y, "dp")  # the second sum

    rep = st.adapters.infer(f, sds(mesh_dp_tp, (8,), P("dp")), mesh=mesh_dp_tp, in_specs=(P("dp"),),
                            out_specs=P())
    assert [(v.code, v.line) for v in rep.violations] == [("SPMD103", line_of(f, "second sum"))]
    assert "jax.lax.psum" in rep.violations[0].headline


def test_infer_report_types_and_signature(mesh_dp_tp):
    def layer(x, params, r):
        h = x @ params["w"] + params["b"]
        return lax.psum(h, "tp"), jnp.sin(r)

    args = (sds(mesh_dp_tp, (4, 8), P("dp")), {"w": jnp.ones((8, 16)), "b": jnp.ones((16,))},
            sds(mesh_dp_tp, (16,), P(reduced={"tp"})))
    in_specs = (P("dp"), {"w": P(None, "tp"), "b": P("tp")}, P(reduced={"tp"}))
    rep = st.adapters.infer(layer, *args, mesh=mesh_dp_tp, in_specs=in_specs,
                            out_specs=(P("dp"), P(reduced={"tp"})))
    assert rep.ok, rep.violations
    # flattening order of the dict argument: b, w
    assert rep.in_types == [st.SpmdType(varying={"dp"}), st.SpmdType(varying={"tp"}),
                            st.SpmdType(varying={"tp"}), st.SpmdType(reduced={"tp"})]
    assert rep.out_types == [st.SpmdType(varying={"dp"}), st.SpmdType(reduced={"tp"})]
    assert rep.signature == ('def layer(x: Varying["dp"], params: Varying["tp"], r: Reduced["tp"])'
                             ' -> tuple[Varying["dp"], Reduced["tp"]]:')
    listing = "\n".join(rep.listing())
    assert "dot_general" in listing and "psum_invariant (jax.lax.psum)" in listing
    assert str(rep).startswith("def layer(") and "ok: no violations" in str(rep)


def test_hint_text():
    t = st.SpmdType(varying={"tp", "dp"}, reduced={"x"})
    assert st.adapters.hint(t, ("dp", "tp", "x")) == 'Typed[Varying["dp", "tp"], Reduced["x"]]'
    assert st.adapters.hint(st.SpmdType()) == "Invariant"
    assert st.adapters.hint(st.SpmdType(unreduced={"dp"})) == 'Unreduced["dp"]'


def test_varying_output_declared_unreduced_is_401_on_every_version(mesh_dp_tp):
    """jax 0.10 inserts a vary_unreduced_cast and accepts; jax 0.12 rejects: both SPMD401."""
    def f(x):  # the def line is where boundary errors point
        return x * 2

    rep = st.adapters.infer(f, sds(mesh_dp_tp, (8,), P("dp")), mesh=mesh_dp_tp, in_specs=(P("dp"),),
                            out_specs=P(unreduced={"dp"}))
    assert [(v.code, v.line) for v in rep.violations] == [("SPMD401", line_of(f, "def f"))]


def test_infer_reraises_jax_errors_it_has_no_code_for(mesh_dp_tp):
    def f(x):
        return x @ jnp.ones((3, 3))  # shape error

    with pytest.raises(TypeError):
        st.adapters.infer(f, sds(mesh_dp_tp, (8, 4), P("dp")), mesh=mesh_dp_tp, in_specs=(P("dp"),),
                          out_specs=P("dp"))


# ------------------------------------------------------------------- typed_shard_map


def test_typed_shard_map_sees_names_routing_cannot(mesh_dp_tp):
    def f(x):
        return imported_psum(imported_psum(x, "dp"), "dp")  # BUG

    fn = st.adapters.typed_shard_map(f, mesh=mesh_dp_tp, in_specs=P("dp"), out_specs=P())
    x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh_dp_tp, P("dp")))
    with pytest.raises(st.SpmdTypeError) as ei:
        fn(x)
    assert ei.value.code == "SPMD103" and ei.value.line == line_of(f, "# BUG")


def test_typed_shard_map_decorator_and_results(mesh_dp_tp):
    @st.adapters.typed_shard_map(mesh=mesh_dp_tp, in_specs=(P("dp", "tp"), P("tp", None)),
                                 out_specs=P("dp"))
    def layer(x, w):
        return lax.psum(x @ w, "tp")

    x = jax.device_put(jnp.arange(32.0).reshape(4, 8), NamedSharding(mesh_dp_tp, P("dp", "tp")))
    w = jax.device_put(jnp.arange(128.0).reshape(8, 16), NamedSharding(mesh_dp_tp, P("tp", None)))
    np.testing.assert_allclose(np.asarray(layer(x, w)), np.asarray(x) @ np.asarray(w))
    assert layer.__name__ == "layer"


def test_typed_shard_map_boundary_errors(mesh_dp_tp):
    def f(x):
        return x

    x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh_dp_tp, P("dp")))
    with pytest.raises(st.SpmdTypeError) as ei:
        st.adapters.typed_shard_map(f, mesh=mesh_dp_tp, in_specs=(P("dp"), P()), out_specs=P("dp"))(x)
    assert ei.value.code == "SPMD402"
    with pytest.raises(st.SpmdTypeError) as ei:
        st.adapters.typed_shard_map(f, mesh=mesh_dp_tp, in_specs=P("dq"), out_specs=P("dp"))
    assert ei.value.code == "SPMD501"
    with pytest.raises(st.SpmdTypeError) as ei:
        st.adapters.typed_shard_map(f, mesh=mesh_dp_tp, in_specs=P("tp"), out_specs=P("tp"))(x)
    assert ei.value.code == "SPMD403"
    with pytest.raises(st.SpmdTypeError) as ei:
        st.adapters.typed_shard_map(f, mesh=mesh_dp_tp, in_specs=P("dp"), out_specs=P())(x)
    assert ei.value.code == "SPMD401" and ei.value.line == line_of(f, "def f")


def test_in_specs_rejection_comes_before_the_body() -> None:
    """JAX checks the arguments against `in_specs` before it traces the body: an argument not
    sharded as its spec says on an Explicit mesh is SPMD403 on every face, even when the body
    has a bug of its own (JAX's shard_map tutorial swaps a scan carry and calls it with an
    unsharded `x`). Sharded right, the body's bug is reported (SPMD302)."""
    mesh = jax.make_mesh((2,), ("i",), axis_types=(jax.sharding.AxisType.Explicit,))

    def f(x, y):
        def body(carry, _):
            c1, c2 = carry
            return (c2, c1), ()   # swap the carry: varying x into invariant y
        (x_, y_), _ = lax.scan(body, (x, y), (), length=2)
        return x_, y_

    def step(x, y):
        return jax.shard_map(f, in_specs=(P("i"), P()), out_specs=P("i"))(x, y)

    typed = st.adapters.typed_shard_map(f, in_specs=(P("i"), P()), out_specs=P("i"))
    faces = {"typed": typed, "typed, jitted": jax.jit(typed),
             "checking": st.adapters.checking(step)}
    y = jnp.arange(3.0)
    with jax.set_mesh(mesh):
        for name, face in faces.items():
            with pytest.raises(st.SpmdTypeError) as ei:
                face(jnp.arange(6.0), y)
            assert (name, ei.value.code) == (name, "SPMD403"), ei.value
            assert "does not match" in str(ei.value)
            with pytest.raises(st.SpmdTypeError) as ei:
                face(jax.device_put(jnp.arange(6.0), P("i")), y)
            assert (name, ei.value.code) == (name, "SPMD302"), ei.value


def test_typed_shard_map_without_check_vma_is_jax(mesh_dp_tp):
    """`check_vma=False`: JAX's program runs, unchanged; the body is analysed as if the
    checks were on, and what they would reject is a `CheckVmaWarning` at its line (once per
    input signature), nothing raised."""
    def f(x):
        return lax.psum(x, "tp")  # Invariant on tp: allowed (and 4x) without check_vma

    x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh_dp_tp, P("dp")))
    fn = st.adapters.typed_shard_map(f, mesh=mesh_dp_tp, in_specs=P("dp"), out_specs=P("dp"),
                                     check_vma=False)
    with pytest.warns(st.adapters.CheckVmaWarning) as rec:
        out = fn(x)
    np.testing.assert_array_equal(np.asarray(out), 4 * np.arange(8.0))
    plain = jax.shard_map(f, mesh=mesh_dp_tp, in_specs=P("dp"), out_specs=P("dp"),
                          check_vma=False)(x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(plain))
    (w,) = [r.message for r in rec if isinstance(r.message, st.adapters.CheckVmaWarning)]
    assert (w.code, w.line) == ("SPMD103", line_of(f, "lax.psum"))
    assert str(w).startswith(f"check_vma=False: {w.source}: SPMD103: with check_vma=True, ")
    assert w.error.code == "SPMD103"
    # rebuilt from its args, as pytest-xdist does with a worker's warnings: the same text,
    # code and line
    again = type(w)(*w.args)
    assert (str(again), again.code, again.line, again.source) == (str(w), w.code, w.line, w.source)
    # the line infer(check_vma=False) reports: one text for both
    rep = st.adapters.infer(f, x, mesh=mesh_dp_tp, in_specs=P("dp"), out_specs=P("dp"),
                            check_vma=False)
    assert rep.check_vma_changes == [str(w).removeprefix("check_vma=False: ")]
    with warnings.catch_warnings():
        warnings.simplefilter("error", st.adapters.CheckVmaWarning)
        np.testing.assert_array_equal(np.asarray(fn(x)), np.asarray(plain))  # analysed once
        np.testing.assert_array_equal(np.asarray(jax.jit(fn)(x)), np.asarray(plain))


def test_a_shard_partial_bug_under_check_vma_false_is_warned_as_wrong_either_way(mesh_dp_tp):
    """A bias added before the psum in a `check_vma=False` body: JAX computes the same wrong
    numbers with the checks on or off, and the warning says so (not "with check_vma=True",
    which would read as harmless while the checks stay off); `infer` prints the same line."""
    def f(x, w, b):
        return lax.psum(x @ w + b, "tp")  # the bias before the psum

    put = lambda a, s: jax.device_put(a, NamedSharding(mesh_dp_tp, s))  # noqa: E731
    args = (put(jnp.ones((8, 8)), P("dp", "tp")), put(jnp.ones((8, 4)), P("tp")),
            put(jnp.ones(4), P()))
    specs = dict(in_specs=(P("dp", "tp"), P("tp"), P()), out_specs=P("dp"))
    fn = st.adapters.typed_shard_map(f, mesh=mesh_dp_tp, check_vma=False, **specs)
    with pytest.warns(st.adapters.CheckVmaWarning) as rec:
        out = fn(*args)
    # the bias counted once per tp device: 8 + 4 * 1 per entry, where one device's sum is 9
    np.testing.assert_array_equal(np.asarray(out), np.full((8, 4), 12.0))
    (w,) = [r.message for r in rec if isinstance(r.message, st.adapters.CheckVmaWarning)]
    assert (w.code, w.line) == ("SPMD210", line_of(f, "lax.psum"))
    assert str(w).startswith(f"check_vma=False: {w.source}: SPMD210: wrong with check_vma=False "
                             "too (JAX computes the same numbers either way), "), str(w)
    rep = st.adapters.infer(f, *args, mesh=mesh_dp_tp, check_vma=False, **specs)
    assert rep.check_vma_changes == [str(w).removeprefix("check_vma=False: ")]


def test_typed_shard_map_without_check_vma_correct_body_is_quiet(mesh_dp_tp):
    def loss(w, x):
        h = jnp.tanh(x @ w)
        return lax.psum(jnp.sum(h * h), "dp") / 8

    w = jax.device_put(jnp.linspace(-1.0, 1.0, 32).reshape(8, 4), NamedSharding(mesh_dp_tp, P()))
    x = jax.device_put(jnp.ones((8, 8)), NamedSharding(mesh_dp_tp, P("dp")))
    kw = dict(mesh=mesh_dp_tp, in_specs=(P(), P("dp")), out_specs=P(), check_vma=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", st.adapters.CheckVmaWarning)
        out = st.adapters.typed_shard_map(loss, **kw)(w, x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(jax.shard_map(loss, **kw)(w, x)))
    np.testing.assert_allclose(np.asarray(out), np.sum(np.tanh(np.ones((8, 8)) @ np.asarray(w)) ** 2) / 8,
                               rtol=1e-6)


# ------------------------------------------------------------------- infer CLI

MLP = ["--mesh", "dp=2,tp=4", "--in-specs", "P('dp', None), P(None, 'tp'), P('tp'), P('tp', None)",
       "--out-specs", "P('dp', None)", "--shapes", "f32[4,8] f32[8,16] f32[16] 16,8"]


def test_cli_infer(capsys):
    rc = _cli.main([f"{PORTING / 'megatron_mlp.py'}:mlp", *MLP])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.splitlines()[0] == ('def mlp(x: Varying["dp"], w1: Varying["tp"], b1: Varying["tp"],'
                                   ' w2: Varying["tp"]) -> Varying["dp"]:')
    gelu = 1 + (PORTING / "megatron_mlp.py").read_text().splitlines().index(
        "    h = jax.nn.gelu(x @ w1 + b1)")
    assert f"megatron_mlp.py:{gelu}: h = jax.nn.gelu(x @ w1 + b1)" in out
    assert "psum_invariant (jax.lax.psum): (Varying['dp', 'tp']) -> Varying['dp']" in out
    assert "ok: no violations" in out


def test_cli_infer_violation_and_usage(capsys):
    rc = _cli.main([f"{PORTING / 'megatron_mlp.py'}:mlp_bug_missing_psum", *MLP])
    out = capsys.readouterr().out
    bug = 1 + next(i for i, line in enumerate((PORTING / "megatron_mlp.py").read_text().splitlines())
                   if line.startswith("def mlp_bug_missing_psum"))
    assert rc == 1 and f"megatron_mlp.py:{bug}: SPMD401" in out
    assert _cli.main([f"{PORTING / 'megatron_mlp.py'}:mlp", *MLP[:-1], "f32[4,8]"]) == 2
    assert _cli.main(["no_colon", *MLP]) == 2
    assert _cli_args.parse_mesh("dp=2, tp=4") == (("dp", "tp"), (2, 4))
    assert _cli_args.parse_shapes("bf16[2,3];[] 4x5") == [("bfloat16", (2, 3)), ("float32", ()),
                                                     ("float32", (4, 5))]
    with pytest.raises(ValueError):
        _cli_args.parse_mesh("dp:2")


def test_main_dispatches_infer(capsys):
    from spmdtyped.__main__ import main
    assert main(["infer", f"{PORTING / 'megatron_mlp.py'}:mlp", *MLP]) == 0
    assert "def mlp(" in capsys.readouterr().out


# ------------------------------------------------------------------- port codemod


def port(src: str) -> str:
    return _codemod.port_source(textwrap.dedent(src))[0]


def test_port_imports():
    out = port("""\
        import jax
        from jax import lax, numpy as jnp
        import jax.lax as L
        from jax.lax import psum, scan
        from jax import shard_map
        from jax.experimental.shard_map import shard_map as smap
        """)
    assert out == textwrap.dedent("""\
        import jax
        from jax import numpy as jnp
        from spmdtyped import lax
        import spmdtyped.lax as L
        from spmdtyped.lax import psum, scan
        from spmdtyped.adapters import typed_shard_map as shard_map
        from spmdtyped.adapters import typed_shard_map as smap
        """)


def test_port_attributes_and_annotations():
    out = port('''\
        """Doc."""
        import jax
        from functools import partial
        from jax.sharding import PartitionSpec as P

        SPECS = (P("dp"), P(None, "tp"), P(unreduced={"tp"}), P("dp", reduced={"tp"}), P())

        def f(x, w, u, r, c):
            return jax.lax.psum(x @ w, "tp")  # keep me

        g = jax.shard_map(f, mesh=mesh, in_specs=SPECS, out_specs=P("dp"))

        @partial(jax.shard_map, mesh=mesh, in_specs=(P("dp"),), out_specs=(P(), P("dp")))
        def h(x: int):
            return x, x

        @jax.shard_map(mesh=mesh, in_specs=specs_from_somewhere, out_specs=P())
        def k(x):
            return jax.lax.axis_index("dp")

        def m(x):
            return x

        m2 = jax.shard_map(m, mesh=mesh, in_specs=P("dp"), out_specs=P("dp"), axis_names={"dp"})
        ''')
    assert out == textwrap.dedent('''\
        """Doc."""
        import jax
        from functools import partial
        from jax.sharding import PartitionSpec as P
        import spmdtyped as st
        from spmdtyped import Invariant, Reduced, Typed, Unreduced, Varying

        SPECS = (P("dp"), P(None, "tp"), P(unreduced={"tp"}), P("dp", reduced={"tp"}), P())

        def f(x: Varying["dp"], w: Varying["tp"], u: Unreduced["tp"], r: Typed[Varying["dp"], Reduced["tp"]], c: Invariant) -> Varying["dp"]:
            return st.psum(x @ w, "tp")  # keep me

        g = st.adapters.typed_shard_map(f, mesh=mesh, in_specs=SPECS, out_specs=P("dp"))

        @partial(st.adapters.typed_shard_map, mesh=mesh, in_specs=(P("dp"),), out_specs=(P(), P("dp")))
        def h(x: int) -> tuple[Invariant, Varying["dp"]]:
            return x, x

        @st.adapters.typed_shard_map(mesh=mesh, in_specs=specs_from_somewhere, out_specs=P())
        def k(x) -> Invariant:
            return st.axis_index("dp")

        def m(x):
            return x

        m2 = st.adapters.typed_shard_map(m, mesh=mesh, in_specs=P("dp"), out_specs=P("dp"), axis_names={"dp"})
        ''')


def test_port_is_idempotent_and_leaves_other_code():
    src = (PORTING / "moe.py").read_text()
    once = _codemod.port_source(src)[0]
    assert _codemod.port_source(once) == (once, [])
    plain = "import numpy as np\nx = np.ones(3)\n"
    assert _codemod.port_source(plain) == (plain, [])


def test_port_cli(tmp_path, capsys):
    from spmdtyped.__main__ import main
    path = tmp_path / "prog.py"
    original = (PORTING / "megatron_mlp.py").read_text()
    path.write_text(original)
    assert main(["port", str(path)]) == 0
    diff = capsys.readouterr().out
    assert diff.startswith(f"--- a/{path}") and "+from spmdtyped import lax" in diff
    assert path.read_text() == original  # a diff only
    assert _port_cli.main([str(path), "--check"]) == 1
    capsys.readouterr()
    assert _port_cli.main([str(path), "--write"]) == 0
    assert path.read_text() == _codemod.port_source(original)[0]
    assert _port_cli.main([str(path), "--check"]) == 0
    assert _port_cli.main([str(tmp_path / "missing.py")]) == 2


def test_primitive_tables_name_rules():
    assert set(st._rules.PRIMITIVES.values()) <= set(st._rules.ELEMENTWISE)
    assert set(st._surface.AXIS_PRIMITIVES.values()) <= set(st._rules.AXIS_OPS)
    assert set(st._rules.PRIMITIVE_OPERANDS) <= set(st._rules.PRIMITIVES)


def many_ops(x, r, u_src):
    """Most primitive rules on Varying, Reduced and Unreduced values that JAX accepts."""
    rr = jnp.sin(r) * jnp.exp(r) + r
    rs = jnp.sum(rr.reshape(2, 4).T, axis=1) + r[:4]
    v = jnp.concatenate([x, x]) * 2.0 - 1.0
    v = jnp.where(v > 0, v, -v) + jnp.maximum(v, 0.5) + jnp.flip(v) + jnp.cumsum(v)
    v = v + jnp.sort(v) + jnp.argmax(v) + v.at[0].add(1.0) + jnp.tanh(v) ** 3
    v = v[:8] + lax.dynamic_slice(v, (1,), (8,)) + jnp.pad(x, 1)[1:9] + v[jnp.arange(8)]
    u = lax.pcast(u_src, "dp", to="unreduced")
    u = (u + u) * lax.pcast(jnp.ones((8,)), "dp", to="reduced")
    u = jnp.sum(u.reshape(2, 4), axis=1)
    return v.astype(jnp.bfloat16), rs, lax.psum(u, "dp")


def test_rule_table_agrees_with_jax_on_many_primitives(mesh_dp_tp):
    args = (sds(mesh_dp_tp, (16,), P("dp")), sds(mesh_dp_tp, (8,), P(reduced={"tp"})), sds(mesh_dp_tp, (16,), P("dp")))
    rep = st.adapters.infer(many_ops, *args, mesh=mesh_dp_tp, in_specs=(P("dp"), P(reduced={"tp"}), P("dp")),
                            out_specs=(P("dp"), P(reduced={"tp"}), P()))
    assert rep.ok, [str(v) for v in rep.violations]
    assert rep.mismatches == []
    prims = {s.primitive for s in rep.steps}
    assert {"sin", "exp", "concatenate", "select_n", "max", "rev", "cumsum", "sort", "argmax",
            "scatter-add", "integer_pow", "dynamic_slice", "pad", "gather",
            "convert_element_type", "reduce_sum", "unreduced_psum"} <= prims
