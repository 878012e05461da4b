"""`python -m spmdtyped stubgen`: the CLI, the axes errors, linear size, and every overload
checked against the rule table (the checkers' side is `test_stubgen_oracle.py`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from spmdtyped import SpmdTypeError, _rules, _surface
from spmdtyped._cli.stubgen import main
from spmdtyped._stubgen import messages, parse_axes, render
from spmdtyped._stubgen.forms import _forms, plan
from spmdtyped._stubgen.model import ANY, Alt, Arr, Overload, Var, lit, match, param_text, var
from spmdtyped._stubgen.select import StubError, axis_rule, select, unary_rule, verify
from spmdtyped._typed import hints as _hints

REPO = Path(__file__).resolve().parent.parent


def test_cli_writes_the_stub_package(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "spmdtyped", "stubgen", "--axes", "dp",
                           "--out", str(tmp_path / "typings")], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    pkg = tmp_path / "typings" / "spmdtyped"
    for name in ("__init__.pyi", "numpy.pyi", "_numpy_binary.pyi", "_numpy_other.pyi", "nn.pyi", "lax.pyi",
                 "adapters/__init__.pyi", "py.typed"):
        assert (pkg / name).exists(), name
    text = (pkg / "__init__.pyi").read_text()
    assert "def psum(x: SArray" in text and '@deprecated("SPMD101' in text
    assert "wrote 8 files" in proc.stdout


@pytest.mark.parametrize(("axes", "fragment"), [
    ("", "comma-separated"), ("dp,,tp", "comma-separated"), ("dp,tp,dp", "repeat ['dp']"),
    ("dp,3x", "'3x' is not a valid axis name"), ("dp,class", "'class' is not a valid axis"),
])
def test_bad_axes_are_usage_errors(axes: str, fragment: str) -> None:
    with pytest.raises(SpmdTypeError) as e:
        parse_axes(axes)
    assert e.value.code == "SPMD504" and fragment in str(e.value)


def test_bad_axes_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--axes", "dp,dp"]) == 2
    err = capsys.readouterr().err
    assert "SPMD504" in err and "fix: --axes dp" in err


def _generic_lines(axes: tuple[str, ...]) -> int:
    """The stub's lines less the two-axis literal overloads (two lines each, never deprecated)."""
    literal = sum(2 for p in plan(axes) for _, _, ovs in p.groups for ov in ovs if ov.literal)
    return sum(t.count("\n") for t in render(axes).values()) - literal


def test_stub_grows_linearly_with_the_axes() -> None:
    # 2 and 3 axes (the 4-axis plan takes ~40 s: benchmarks/bench_pyright.py writes it): the
    # third axis adds no more than the mean size per axis at two (an exact encoding, which
    # grows exponentially, fails this; measured 4133 (+462 literal) -> 4890 -> 5822 lines at 2-4 axes)
    sizes = {n: _generic_lines(("dp", "tp", "fsdp")[:n]) for n in (2, 3)}
    assert 0 < sizes[3] - sizes[2] <= sizes[2] / 2, sizes


def test_literal_overloads_only_at_two_axes_and_bounded() -> None:
    """The literal patch: a bounded number at two axes (one per combination the generic
    patterns miss), none beyond (where the combinations multiply)."""
    two = sum(1 for p in plan(("dp", "tp")) for _, _, ovs in p.groups for ov in ovs if ov.literal)
    three = sum(1 for p in plan(("dp", "tp", "fsdp")) for _, _, ovs in p.groups for ov in ovs
                if ov.literal)
    assert 0 < two <= 300 and three == 0, (two, three)


def test_every_overload_agrees_with_the_rule_table() -> None:
    """`plan` raises StubError on any disagreement; here: no wrong result, no miss at 2 axes."""
    for p in plan(("dp", "tp")):
        assert not p.tally.wrong, p.tally.wrong[:3]
        assert p.tally.missed == 0, (p.form.name, p.tally.missed_examples[:3])


#: rows JAX types on a Reduced value but cannot lower (`_rules.VARY`): spmdtyped binds them on
#: the value cast to Varying, so Reduced -> Varying; the stub has no such overload and reports
#: a false error on a Reduced input (documented in docs/pyright.md)
_REDUCED_TO_VARYING = frozenset(
    name for name, row in _rules.ELEMENTWISE.items() if row.on_reduced == _rules.VARY)


def test_collectives_exact_at_two_and_three_axes() -> None:
    assert {"sort", "cumprod", "sigmoid", "silu"} <= _REDUCED_TO_VARYING
    for axes in (("dp", "tp"), ("dp", "tp", "fsdp")):  # plans shared with the test above
        for p in plan(axes):
            if p.form.rule in _REDUCED_TO_VARYING:
                continue
            if p.form.kind in ("collective", "unop") or p.form.binding == "unary":
                assert p.tally.false_errors == 0, (p.form.name, p.tally.false_examples[:3])


def test_collective_overloads_merged_by_state() -> None:
    """pyright evaluates a nested argument once per overload it tries (docs/pyright.md, "Cost"):
    a collective's legal overloads of every axis come before its union catches, and a Varying
    call over the second axis tries no Unreduced overload of the first; each axis keeps the
    order `select` checked."""
    text = render(("dp", "tp"))["spmdtyped/__init__.pyi"]
    psum = [ln for ln in text.splitlines() if ln.startswith("def psum(x: SArray")]
    unions = [k for k, ln in enumerate(psum) if "] | SArray[" in ln]
    legal = [k for k, ln in enumerate(psum) if ln.endswith("]: ...")]
    assert unions and legal and max(legal) < min(unions), psum
    first_tp_varying = next(k for k, ln in enumerate(psum)
                            if 'x: SArray[Literal["tp"] | _Vd_tp' in ln)
    assert not any('Literal["dp"]' in ln.split(", axis_name")[0].split(",")[1]
                   for ln in psum[:first_tp_varying]), psum[:first_tp_varying]
    (p,) = [p for p in plan(("dp", "tp")) if p.form.name == "psum"]
    for _, axis, ovs in p.groups:
        mine = [ln.split("x: ", 1)[1].split(", axis_name")[0] for ln in psum
                if f'axis_name: Literal["{axis}"]' in ln]
        assert mine == [param_text(ov.params[0]) for ov in ovs], axis


def test_select_refuses_what_the_rules_reject() -> None:
    """A candidate that would give a legal combination the wrong result is never chosen, and
    `verify` reports one that is forced in."""
    v, u, r = Var("_V1"), Var("_U"), Var("_R")
    keep_all = Overload((Arr(var(v), var(u), var(r)),), Arr(var(v), var(u), var(r)))
    combos = [(t,) for t in (_rules.SpmdType(), _rules.SpmdType(unreduced="dp"))]
    rule = unary_rule("tanh", _rules.CONSERVATIVE, "tanh")
    assert select([keep_all], combos, rule) == []  # tanh of Unreduced is an error
    wrong = Overload((Arr(var(v), var(u), var(r)),), Arr(lit("dp"), var(u), var(r)))
    tally = verify([wrong], combos, rule, "tanh")
    assert tally.wrong and "Invariant" in tally.wrong[0]


def test_plan_raises_on_a_disagreement(monkeypatch: pytest.MonkeyPatch) -> None:
    import spmdtyped._stubgen.forms as forms
    import spmdtyped._stubgen.select as sel

    # plan_form is not memoised (plan is): the patched selection reaches no other test
    monkeypatch.setattr(forms, "select", lambda pool, *a, **k: [
        Overload(pool[0].params, Arr(lit("dp"), pool[0].params[0].u, pool[0].params[0].r))
        if isinstance(pool[0].params[0], Arr) else pool[0]])
    with pytest.raises(StubError, match="disagrees with the rule table"):
        forms.plan_form(forms.Form("unop", "__neg__", "neg"), ("dp", "tp"), sel._rules.CONSERVATIVE)


def test_model_matches_pyright_on_the_known_cases() -> None:
    """The solver behaviours measured on pyright 1.1.414 (see _stubgen_model's docstring)."""
    a = Var("_Vo_dp", frozenset({"tp"}))
    ov = Overload((Arr(var(a, "dp"), var(Var("_U")), var(Var("_R"))),), Arr(var(a), var(Var("_U")), var(Var("_R"))))
    assert match(ov, [_rules.SpmdType(varying="dp")]) == (True, None)  # unsolved -> Unknown
    assert match(ov, [_rules.SpmdType(varying=("dp", "tp"))])[1] == _rules.SpmdType(varying="tp")
    inv = Overload((Arr(var(Var("_V1")), var(Var("_U")), var(Var("_Rq"), "dp")),), None, "x")
    assert not match(inv, [_rules.SpmdType(reduced="dp")])[0]  # Literal['dp'] vs 'dp' | T


def test_model_reads_a_never_default() -> None:
    """`default=Never` (PEP 696): `Literal["dp"] | _Vd_dp` against `Literal["dp"]` solves
    `_Vd_dp` to Never under both checkers (the exact Varying pattern before it is not needed);
    against `Never` pyright still leaves it Unknown; a U slot still rejects the literal alone."""
    d, u, r = (Var(f"_{k}d_dp", frozenset({"tp"}), never_default=True) for k in "VUR")
    ov = Overload((Arr(var(d, "dp"), var(u), var(r)),), Arr(var(d), var(u), var(r)))
    for mypy in (False, True):
        assert match(ov, [_rules.SpmdType(varying="dp")], mypy=mypy) == (True, _rules.SpmdType())
        assert match(ov, [_rules.SpmdType(varying=("dp", "tp"))], mypy=mypy)[1] == \
            _rules.SpmdType(varying="tp")
    assert match(ov, [_rules.SpmdType()]) == (True, None)
    un = Overload((Arr(var(d), var(u, "dp"), var(r)),), Arr(var(d), var(u), var(r)))
    assert not match(un, [_rules.SpmdType(unreduced="dp")])[0]
    text = render(("dp", "tp"))["spmdtyped/__init__.pyi"]
    assert '_Vd_tp = TypeVar("_Vd_tp", bound=Literal["dp"], default=Never)' in text
    assert 'def psum(x: SArray[Literal["tp"], ' not in text


def test_model_knows_how_plain_mypy_solves_a_literal_next_to_a_typevar() -> None:
    """mypy joins the two or more literals `_Ro_dp` must take to `str` (bound violated: no
    match) where pyright subtracts; a union of literal sets matches in both."""
    ro = Var("_Ro_dp", frozenset({"tp", "sp"}))
    ov = Overload((Arr(ANY, ANY, var(ro, "dp")),), None, "x")
    full = _rules.SpmdType(reduced=("dp", "tp", "sp"))
    two = _rules.SpmdType(reduced=("dp", "tp"))
    assert match(ov, [full])[0] and not match(ov, [full], mypy=True)[0]
    assert match(ov, [two], mypy=True)[0]
    alt = Overload((Alt(tuple(Arr(ANY, ANY, lit(*s)) for s in (("dp",), ("dp", "sp", "tp")))),),
                   None, "x")
    assert match(alt, [full], mypy=True)[0] and not match(alt, [two], mypy=True)[0]


def test_collectives_let_no_misuse_through_plain_mypy_at_three_axes() -> None:
    """`plan` refuses a collective overload list through which mypy would let misuse pass (the
    catches are unions of literal sets); replayed here as mypy solves them."""
    axes = ("dp", "tp", "fsdp")
    from spmdtyped._stubgen.model import states
    for p in plan(axes):
        if p.form.kind != "collective":
            continue
        for to, a, ovs in p.groups:
            row = dict(p.form.rows)[to]
            rule = axis_rule(row, a or "", _rules.CONSERVATIVE, p.form.name)
            t = verify(ovs, [(s,) for s in states(axes)], rule, p.form.name, mypy=True)
            assert t.missed == 0, (p.form.name, a, t.missed_examples[:3])


def test_plain_properties_come_from_the_static_view() -> None:
    """`SArray`'s state-free properties are written once, in `_static.py`; the stub copies them
    (`weak_type` included) and keeps its own state-bearing ones (`T`, `at`)."""
    from spmdtyped import _static
    from spmdtyped._stubgen import plain_properties
    text = render(("dp",))["spmdtyped/__init__.pyi"]
    names = {ln.split("def ")[1].split("(")[0] for ln in plain_properties() if "def " in ln}
    assert {"raw", "shape", "dtype", "weak_type"} <= names and not {"T", "at"} & names
    assert all(isinstance(getattr(_static.SArray, n), property) for n in names)
    assert "    def weak_type(self) -> bool: ..." in text


def test_forms_cover_the_surface_table() -> None:
    """Every typed operator `_hints` installs on SArray (a `_surface` row) is a form of the stub,
    and every st.numpy / st.nn function is one."""
    dunders = {n for n in vars(_hints.SArray) if _surface.by_dunder(n) is not None}
    named = {f.name for f in _forms()} | {f.reflected for f in _forms() if f.reflected}
    assert dunders and not dunders - named, sorted(dunders - named)
    funcs = {(f.module, f.name) for f in _forms() if f.kind == "function"}
    assert {("spmdtyped.numpy", r.name) for r in _surface.NUMPY} <= funcs
    assert {("spmdtyped.nn", r.name) for r in _surface.NN} <= funcs


def test_deprecations_carry_the_runtime_code_and_fix() -> None:
    msgs = messages(("dp", "tp"))
    psum_r = [m for m in msgs if m.startswith("spmdtyped.psum[dp]: SPMD101")]
    assert psum_r and "st.pcast(x, 'dp', to='varying')" in psum_r[0]
    assert any(m.startswith("spmdtyped.psum[tp]: SPMD103") for m in msgs)
    assert any(m.startswith("spmdtyped.nn.relu: SPMD203") for m in msgs)
    assert any("operator +" in m and "SPMD203" in m for m in msgs)
