"""`examples/` under pyright with the generated stub (issue 16): each example checked against a
stub for the axes it uses, its axis aliases (`dp: TypeAlias = Literal["dp"]`, docs/pyright.md)
appended so line numbers stay; `examples/broken/` rejected at its `# expect:` line for the codes
the stub covers (not the shard_map boundary, SPMD4xx)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import pyright_or_skip

from spmdtyped._stubgen import write

REPO = Path(__file__).resolve().parent.parent
AXES = re.compile(r'"(dp|tp|ep|pp|sp|fsdp)"')
CANONICAL = ("dp", "tp", "fsdp")
EXPECT = re.compile(r"#\s*expect:\s*(SPMD\d+)")


@pytest.fixture(scope="module")
def diagnostics(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[int, str]]]:
    """{example path: [(line, message)]} of pyright's errors, one run per axis vocabulary."""
    exe = pyright_or_skip()
    # the stub depends on the number of axes, not their names: each example's axes are renamed
    # to the first names of CANONICAL (`pp` -> `tp` next to `dp`), so two stubs serve them all
    groups: dict[tuple[str, ...], list[tuple[Path, str]]] = {}
    for f in sorted([*REPO.glob("examples/*.py"), *REPO.glob("examples/broken/*.py")]):
        text = f.read_text()
        own = sorted(set(AXES.findall(text)), key=lambda a: (a != "dp", a)) or ["dp"]
        axes = CANONICAL[:len(own)]
        for a, b in zip(own, axes, strict=True):
            if a != b:
                assert f'"{b}"' not in text, (f, a, b)
                text = text.replace(f'"{a}"', f'"{b}"').replace(f"'{a}'", f"'{b}'")
        groups.setdefault(axes, []).append((f, text))
    out: dict[str, list[tuple[int, str]]] = {}
    for axes, files in groups.items():
        d = tmp_path_factory.mktemp("_".join(axes))
        write(axes, d / "typings")
        for f, text in files:
            dst = d / f.relative_to(REPO)
            dst.parent.mkdir(parents=True, exist_ok=True)
            aliases = "".join(f"{a}: _typing.TypeAlias = _typing.Literal[{a!r}]\n" for a in axes)
            dst.write_text(text + "\nimport typing as _typing\n" + aliases)
        (d / "pyrightconfig.json").write_text(json.dumps({
            "reportDeprecated": "error", "exclude": ["typings"], "pythonVersion": "3.11"}))
        proc = subprocess.run([exe, "--outputjson", "--pythonpath", sys.executable], cwd=d,
                              capture_output=True, text=True, timeout=300)
        for diag in json.loads(proc.stdout)["generalDiagnostics"]:
            if diag["severity"] == "error":
                rel = str(Path(diag["file"]).relative_to(d))
                out.setdefault(rel, []).append((diag["range"]["start"]["line"] + 1,
                                                diag["message"]))
    return out


def test_broken_examples_rejected_at_the_marked_line(
        diagnostics: dict[str, list[tuple[int, str]]]) -> None:
    checked = 0
    for f in sorted(REPO.glob("examples/broken/*.py")):
        for k, line in enumerate(f.read_text().splitlines(), 1):
            m = EXPECT.search(line)
            if not m or m.group(1).startswith("SPMD4"):   # the boundary: not in this tier
                continue
            rel = str(f.relative_to(REPO))
            hits = [msg for ln, msg in diagnostics.get(rel, []) if ln == k]
            # an error on the line (the stub may name a sibling code: SPMD101 for SPMD103)
            assert hits, (rel, k, m.group(1), diagnostics.get(rel))
            checked += 1
    assert checked >= 10


def test_clean_examples_have_no_false_deprecation(
        diagnostics: dict[str, list[tuple[int, str]]]) -> None:
    """No deprecation on a clean example: the loop carries, `st.value_and_grad`'s loss and the
    helpers are typed (a value pyright sees as plain `Any` would match the deprecated overloads
    too, docs/pyright.md)."""
    found = [(rel, ln, msg) for rel, ds in diagnostics.items() if "broken" not in rel
             for ln, msg in ds if "deprecated" in msg]
    assert not found, found


UNTYPED = '''
from typing import Literal, TypeAlias
import spmdtyped as st
from spmdtyped import Reduced, Varying

dp: TypeAlias = Literal["dp"]
tp: TypeAlias = Literal["tp"]


def f(a: Varying["dp"], b: Varying["tp"], r: Reduced["tp"]) -> None:
    e = st.numpy.einsum("ij,jk->ik", a, b)          # not computed by the stub: _Untyped
    st.numpy.tanh(e), st.nn.relu(e), st.psum(e, "tp"), st.pcast(e, "tp", to="varying")
    e + r, r + e, e @ b, -e, e.sum(), e.T, e[0], st.numpy.maximum(e, r), st.numpy.add(r, e)
    st.psum(r, "tp")                                # error: SPMD101 (a typed misuse still is)
'''


def test_untyped_results_raise_no_deprecation(tmp_path: Path) -> None:
    """Results the stub does not compute (`einsum`, `where`, ...) are `_Untyped`: every form
    takes them in a first, non-deprecated overload; a typed misuse next to them is still one."""
    exe = pyright_or_skip()
    write(("dp", "tp"), tmp_path / "typings")
    (tmp_path / "m.py").write_text(UNTYPED)
    (tmp_path / "pyrightconfig.json").write_text(json.dumps({
        "reportDeprecated": "error", "exclude": ["typings"], "pythonVersion": "3.11",
        "reportUnusedExpression": "none"}))
    proc = subprocess.run([exe, "--outputjson", "--pythonpath", sys.executable, "m.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    errors = [(d["range"]["start"]["line"] + 1, d["message"])
              for d in json.loads(proc.stdout)["generalDiagnostics"] if d["severity"] == "error"]
    want = [k for k, ln in enumerate(UNTYPED.splitlines(), 1) if "# error" in ln]
    assert [ln for ln, _ in errors] == want and "SPMD101" in errors[0][1], errors


TYPED = '''
from typing import Literal, TypeAlias
import spmdtyped as st
from spmdtyped import Invariant, Reduced, Unreduced, Varying

dp: TypeAlias = Literal["dp"]
tp: TypeAlias = Literal["tp"]


def loss(w: Reduced["dp"], x: Varying["dp"]) -> Varying["dp"]:
    return st.numpy.mean(x @ w)


def f(x: Varying["dp"], w1: Varying["tp"], b: Invariant, r: Reduced["dp"], u: Unreduced["tp"]) -> None:
    reveal_type(st.numpy.tanh(x @ w1 + b))                     # dp tp | - | -
    reveal_type(st.psum(x @ w1 + b, "tp"))                     # dp | - | -
    reveal_type(st.numpy.add(x @ w1, b * 2.0))                 # dp tp | - | -
    reveal_type(st.value_and_grad(loss)(r, x)[0])              # dp | - | -
    reveal_type(st.value_and_grad(loss)(r, x)[1])              # - | dp | -
    reveal_type(st.grad(loss)(r, x))                           # - | dp | -
    reveal_type(st.fori_loop(0, 3, lambda i, c: c, (x, u))[1])  # - | tp | -
'''


def test_nested_calls_loops_and_grads_are_typed(tmp_path: Path) -> None:
    """A nested expression keeps its exact state through a function's overloads (its first,
    bare-TypeVar overload adds no expected type); loop carries, `value_and_grad`'s loss and the
    gradient of a first argument (its cotangent: U <-> R) are typed."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _stubgen_oracle import parse_sarray

    from spmdtyped._rules import SpmdType
    exe = pyright_or_skip()
    write(("dp", "tp"), tmp_path / "typings")
    (tmp_path / "m.py").write_text(TYPED)
    (tmp_path / "pyrightconfig.json").write_text(json.dumps({
        "reportDeprecated": "error", "exclude": ["typings"], "pythonVersion": "3.11"}))
    proc = subprocess.run([exe, "--outputjson", "--pythonpath", sys.executable, "m.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    diags = json.loads(proc.stdout)["generalDiagnostics"]
    assert not [d for d in diags if d["severity"] == "error"], diags
    got = {d["range"]["start"]["line"] + 1: parse_sarray(d["message"].split('" is "', 1)[-1])
           for d in diags if d["message"].startswith("Type of")}
    for k, line in enumerate(TYPED.splitlines(), 1):
        if "reveal_type" in line:
            v, u, r = (tuple(s.split()) if s.strip() != "-" else ()
                       for s in line.split("# ")[1].split("|"))
            assert got.get(k) == SpmdType(v, u, r), (line, got.get(k))
