"""The oracle harness of the pyright tier: generated snippets checked by pyright and plain mypy
against `python -m spmdtyped stubgen`'s stub, compared with the rule table.

One snippet per (form, state combination): a function whose parameters carry the states, whose
body is one call with `reveal_type`. All snippets of a run go in one file per checker; each
line's verdict (error or not, revealed type) is compared with `spmdtyped._rules`.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from spmdtyped import _rules
from spmdtyped._errors import SpmdTypeError
from spmdtyped._rules import LITERAL, SpmdType
from spmdtyped._stubgen import write
from spmdtyped._stubgen.model import states

REPO = Path(__file__).resolve().parent.parent
F = _rules.CONSERVATIVE


def ann(t: SpmdType) -> str:
    def slot(s: frozenset[str]) -> str:
        return "Literal[" + ", ".join(f'"{a}"' for a in sorted(s)) + "]" if s else "Never"
    return f"SArray[{slot(t.varying)}, {slot(t.unreduced)}, {slot(t.reduced)}]"


@dataclasses.dataclass(frozen=True)
class Case:
    """One snippet: `expr` over parameters `params`; `want` the rule table's verdict."""

    cls: str          # the class the issue names ("collective", "U + I", ...) or the form
    params: tuple[tuple[str, SpmdType], ...]
    expr: str
    want: SpmdType | SpmdTypeError


def _outcome(fn: Callable[[], SpmdType]) -> SpmdType | SpmdTypeError:
    try:
        return fn()
    except SpmdTypeError as e:
        return e


def _binary_class(sym: str, a: SpmdType, b: SpmdType) -> str:
    """The issue's must-catch classes: U + I, R + I, V + U on some axis (else the operator)."""
    if sym != "+":
        return sym
    pairs = {(a.state(x), b.state(x)) for x in a.axes | b.axes}
    I, V, U, R = _rules.I, _rules.V, _rules.U, _rules.R  # noqa: E741,N806
    for name, p in (("U + I", (U, I)), ("R + I", (R, I)), ("V + U", (V, U))):
        if p in pairs or p[::-1] in pairs:
            return name
    return "+"


BINARY = {"+": "add", "-": "sub", "*": "mul", "/": "div", "@": "matmul", "**": "pow", "<": "lt",
          "%": "mod"}
UNARY = {"st.numpy.tanh": "tanh", "st.nn.relu": "relu", "st.numpy.exp": "exp", "-": "neg",
         ".reshape": "reshape", "st.numpy.cumsum": "cumsum", ".sum": "sum"}
COLLECTIVES = (("psum", "psum", ""), ("pmean", "pmean", ""), ("pmax", "pmax", ""),
               ("ppermute", "ppermute", ", [(0, 1)]"), ("all_gather", "all_gather", ""),
               ("all_gather", "all_gather_reduced", ', to="reduced"'),
               ("psum_scatter", "psum_scatter", ""), ("all_to_all", "all_to_all", ", 0, 0"),
               ("pvary", "pvary", ""), ("pcast", "pcast_varying", ', to="varying"'),
               ("pcast", "pcast_reduced", ', to="reduced"'),
               ("pcast", "pcast_unreduced", ', to="unreduced"'))


def cases(axes: Sequence[str], sample: int | None = None, seed: int = 0) -> list[Case]:
    """Every state combination of the forms above (or `sample` of them per form)."""
    rng = random.Random(seed)
    all_states = states(axes)
    pairs = [(a, b) for a in all_states for b in all_states]

    def pick(xs: list) -> list:  # type: ignore[type-arg]
        return xs if sample is None or len(xs) <= sample else rng.sample(xs, sample)

    out: list[Case] = []
    for sym, rule in BINARY.items():
        for a, b in pick(pairs):
            out.append(Case(_binary_class(sym, a, b), (("x", a), ("y", b)), f"x {sym} y",
                            _outcome(lambda a=a, b=b, rule=rule: _rules.binary(rule, a, b, F).type)))
        for a in pick(all_states):
            out.append(Case(f"{sym} scalar", (("x", a),), f"x {sym} 2.0",
                            _outcome(lambda a=a, rule=rule: _rules.binary(rule, a, LITERAL, F).type)))
            out.append(Case(f"scalar {sym}", (("x", a),), f"3.0 {sym} x",
                            _outcome(lambda a=a, rule=rule: _rules.binary(rule, LITERAL, a, F).type)))
    for fn, rule in (("add", "add"), ("maximum", "maximum")):
        for a, b in pick(pairs):
            out.append(Case(f"st.numpy.{fn}", (("x", a), ("y", b)), f"st.numpy.{fn}(x, y)",
                            _outcome(lambda a=a, b=b, rule=rule: _rules.binary(rule, a, b, F).type)))
    for fn, rule in UNARY.items():
        expr = {"-": "-x", ".reshape": "x.reshape(4, 2)", ".sum": "x.sum(0)"}.get(fn, f"{fn}(x)")
        label = "non-linear on Unreduced" if rule in ("tanh", "exp") else fn
        for a in pick(all_states):
            cls = "relu of Reduced" if rule == "relu" and a.reduced else (
                label if a.unreduced or label == fn else fn)
            out.append(Case(cls, (("x", a),), expr,
                            _outcome(lambda a=a, rule=rule: _rules.unary(rule, a, F))))
    for fn, row, extra in COLLECTIVES:
        for ax in axes:
            for a in pick(all_states):
                out.append(Case("collective", (("x", a),), f'st.{fn}(x, "{ax}"{extra})',
                                _outcome(lambda a=a, row=row, ax=ax: _rules.axis_op(row, a, (ax,), F))))
    return out


def snippet_file(cs: Sequence[Case], axes: Sequence[str]) -> tuple[str, dict[int, int]]:
    """The file text and {line of the expression (1-based): case index}."""
    lines = ["from typing import Literal, Never, reveal_type", "import spmdtyped as st",
             "from spmdtyped import SArray", ""]
    where = {}
    for k, c in enumerate(cs):
        params = ", ".join(f"{n}: {ann(t)}" for n, t in c.params)
        lines.append(f"def c{k}({params}) -> None:")
        lines.append(f"    reveal_type({c.expr})")
        where[len(lines)] = k
    return "\n".join(lines) + "\n", where


_NAME = re.compile(r"'([^']*)'")


def parse_sarray(text: str) -> SpmdType | str:
    """`SArray[Literal['dp'] | Literal['tp'], Never, Never]` (either checker's spelling) ->
    SpmdType; anything else (Any, Unknown) -> the text."""
    m = re.search(r"SArray\[(.*)\]", text)
    if not m:
        return text
    body, depth, parts, cur = m.group(1), 0, [], ""
    for ch in body:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    if len(parts) != 3 or any("Any" in p or "Unknown" in p for p in parts):
        return text
    v, u, r = (frozenset(_NAME.findall(p)) for p in parts)
    try:
        return SpmdType(v, u, r)
    except SpmdTypeError:
        return text


@dataclasses.dataclass
class Verdicts:
    errors: set[int]
    revealed: dict[int, SpmdType | str]
    raw: str


def run_pyright(folder: Path, text: str) -> Verdicts:
    exe = shutil.which("pyright", path=str(Path(sys.executable).parent)) or "pyright"
    (folder / "snippets.py").write_text(text)
    (folder / "pyrightconfig.json").write_text(json.dumps({
        "reportDeprecated": "error", "exclude": ["typings"], "pythonVersion": "3.11",
        "reportUnusedExpression": "none"}))
    proc = subprocess.run([exe, "--outputjson", "--pythonpath", sys.executable, "snippets.py"],
                          cwd=folder, capture_output=True, text=True, timeout=600)
    data = json.loads(proc.stdout)
    errors, revealed = set(), {}
    for d in data["generalDiagnostics"]:
        line = d["range"]["start"]["line"] + 1
        if d["severity"] == "error":
            errors.add(line)
        elif d["message"].startswith("Type of"):
            revealed[line] = parse_sarray(d["message"].split('" is "', 1)[-1])
    return Verdicts(errors, revealed, proc.stdout[-3000:])


def run_mypy(folder: Path, text: str) -> Verdicts:
    (folder / "snippets.py").write_text(text)
    (folder / "mypy.ini").write_text("[mypy]\nmypy_path = typings\nenable_error_code = deprecated\n"
                                     "show_error_codes = True\n")
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the stub, not the package, must answer `import spmdtyped`
    proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", "mypy.ini",
                           "--cache-dir", str(folder / ".mypy_cache"), "--no-error-summary",
                           "snippets.py"], cwd=folder, capture_output=True, text=True,
                          timeout=600, env=env)
    errors, revealed = set(), {}
    for ln in proc.stdout.splitlines():
        m = re.match(r"snippets\.py:(\d+): (error|note): (.*)", ln)
        if not m:
            continue
        line = int(m.group(1))
        if m.group(2) == "error":
            errors.add(line)
        elif m.group(3).startswith("Revealed type is"):
            revealed[line] = parse_sarray(m.group(3))
    return Verdicts(errors, revealed, proc.stdout[-3000:] + proc.stderr[-2000:])


@dataclasses.dataclass
class Score:
    exact: int = 0
    false_errors: int = 0
    caught: int = 0
    missed: int = 0
    imprecise: int = 0   # legal, no error, but the revealed state is not the rule's
    by_class: dict[str, collections.Counter] = dataclasses.field(  # type: ignore[type-arg]
        default_factory=lambda: collections.defaultdict(collections.Counter))
    examples: dict[str, list[str]] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(list))

    @property
    def legal(self) -> int:
        return self.exact + self.false_errors + self.imprecise


def score(cs: Sequence[Case], where: dict[int, int], v: Verdicts) -> Score:
    s = Score()
    for line, k in where.items():
        c = cs[k]
        legal = not isinstance(c.want, SpmdTypeError)
        err = line in v.errors
        got = v.revealed.get(line)
        if legal and not err and got == c.want:
            key = "exact"
        elif legal and err:
            key = "false_errors"
        elif legal:
            key = "imprecise"
        elif err:
            key = "caught"
        else:
            key = "missed"
        setattr(s, key, getattr(s, key) + 1)
        s.by_class[c.cls][key] += 1
        if key not in ("exact", "caught") and len(s.examples[key]) < 12:
            args = ", ".join(f"{n}: {t}" for n, t in c.params)
            s.examples[key].append(f"{c.expr} with {args} -> rule {getattr(c.want, 'code', c.want)}, "
                                   f"checker {'error' if err else got}")
    return s


def check(folder: Path, axes: Sequence[str], cs: Sequence[Case], checker: str) -> Score:
    write(axes, folder / "typings")
    text, where = snippet_file(cs, axes)
    v = (run_pyright if checker == "pyright" else run_mypy)(folder, text)
    if not v.revealed:
        raise RuntimeError(f"{checker} revealed nothing:\n{v.raw}")
    return score(cs, where, v)
