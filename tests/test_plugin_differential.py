"""Differential test of the mypy plugin against the runtime.

Random programs from `tests/_programs.py` are rendered as typed source with a `reveal_type`
after every step. The same files are

- checked by mypy with `spmdtyped.mypy_plugin` (one mypy run for all programs), and
- executed: traced through `st.shard_map` on 8 simulated CPU devices, where `reveal_type`
  records `st.typeof` of each step's value.

For every step the runtime reached: a precise revealed type equals the runtime's state, and
the plugin reports no error where the runtime accepted. Where the runtime raised an
`SpmdTypeError`, the plugin reports the same code (`spmd-<slug>`) on that line, or does not
know the operands' states (revealed `Any`). Out-spec errors (SPMD4xx) are not static.
"""

from __future__ import annotations

import collections
import re
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import _programs as pg
import jax
from hypothesis import HealthCheck, given, settings
from test_typing import CACHE, mypy_config, run_mypy

import spmdtyped as st
from spmdtyped import _compat, _rules
from spmdtyped._errors import REGISTRY, SpmdTypeError

N_PROGRAMS = 40

_REVEAL = re.compile(r'^(?P<file>[^:]+):(?P<line>\d+): note: Revealed type is "(?P<type>.*)"$')
_ERROR = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): error: (?P<msg>.*?)  \[(?P<code>[\w-]+)\]$")
_SARRAY = re.compile(r"^spmdtyped\._static\.SArray\[(.*)\]$")


def _programs(n: int) -> list[pg.Program]:
    out: list[pg.Program] = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(pg.programs(kinds=pg.KINDS, min_steps=3, max_steps=8))
    def collect(program: pg.Program) -> None:
        out.append(program)

    collect()
    seen: set[pg.Program] = set()
    return [p for p in out if not (p in seen or seen.add(p))]  # type: ignore[func-returns-value]


def _source(program: pg.Program) -> tuple[str, list[int]]:
    """The typed module with `reveal_type(vN)` after each step; the reveal lines (1-based)."""
    src = pg.render_source(program, "typed", trace=False)
    lines = src.splitlines()
    out: list[str] = []
    reveal_lines: list[int] = []
    for line in lines:
        out.append(line)
        m = re.match(r"^    (v\d+) = ", line)
        if m:
            out.append(f"    reveal_type({m.group(1)})")
            reveal_lines.append(len(out))
    return "\n".join(out) + "\n", reveal_lines


def _parse_static(t: str) -> _rules.SpmdType | None:
    """A revealed `SArray[V, U, R]` as an SpmdType; None when any part is not a Literal set."""
    m = _SARRAY.match(t)
    if not m:
        return None
    parts = _split_args(m.group(1))
    sets = []
    for p in parts:
        if p == "Never":
            sets.append(frozenset())
            continue
        items = [s.strip() for s in p.split("|")]
        if not all(re.fullmatch(r"Literal\[[^\]]+\]", i) for i in items):
            return None
        sets.append(frozenset(a for i in items for a in re.findall(r"'([^']*)'", i)))
    return _rules.SpmdType(*sets)


def _split_args(s: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return parts


class _Runtime:
    """One program executed: the state revealed at each line, and where it stopped."""

    def __init__(self, src: str, name: str) -> None:
        self.types: dict[int, _rules.SpmdType] = {}
        self.stop_line: int | None = None
        self.error: BaseException | None = None
        ns: dict[str, Any] = {"reveal_type": self._reveal, "__name__": name}
        try:
            exec(compile(src, name, "exec"), ns)  # noqa: S102 - our own generated program
            jax.jit(ns["program"]).trace(*ns["args"])
        except Exception as e:  # noqa: BLE001 - classified below
            self.error = e
            lines = [n for f, n in traceback.walk_tb(e.__traceback__)
                     if f.f_code.co_filename == name and f.f_code.co_name == "program"]
            self.stop_line = lines[-1] if lines else None

    def _reveal(self, x: Any) -> Any:
        self.types[sys._getframe(1).f_lineno] = st.typeof(x)
        return x


def _jax_setting() -> str:
    """The plugin's `[spmdtyped] jax = ...` for the installed JAX's rule set."""
    from spmdtyped.mypy_plugin import FEATURE_SETS

    return next(k for k, v in FEATURE_SETS.items() if v == _compat.FEATURES and k != "conservative")


def test_plugin_agrees_with_runtime() -> None:
    programs = _programs(N_PROGRAMS)
    assert len(programs) >= N_PROGRAMS // 2
    tmp = Path(tempfile.mkdtemp(prefix="spmdtyped-diff-"))
    sources: dict[str, tuple[pg.Program, str, list[int]]] = {}
    for k, program in enumerate(programs):
        src, reveals = _source(program)
        name = f"prog_{k}.py"
        (tmp / name).write_text(src)
        sources[name] = (program, src, reveals)

    # the plugin checks with the installed JAX's rules here (by default it assumes the rules
    # every supported JAX allows, which are stricter than jax 0.12's)
    cfg = mypy_config(tmp, plugin=True, extra=f"[spmdtyped]\njax = {_jax_setting()}\n")
    _, out = run_mypy([tmp / n for n in sources], cfg, CACHE / "diff", cwd=tmp)
    revealed: dict[tuple[str, int], str] = {}
    errors: dict[tuple[str, int], list[str]] = collections.defaultdict(list)
    for line in out.splitlines():
        if m := _REVEAL.match(line):
            revealed[(m.group("file"), int(m.group("line")))] = m.group("type")
        elif m := _ERROR.match(line):
            errors[(m.group("file"), int(m.group("line")))].append(m.group("code"))

    stats: collections.Counter[str] = collections.Counter()
    problems: list[str] = []
    for name, (_program, src, reveals) in sources.items():
        rt = _Runtime(src, str(tmp / name))
        for reveal_line in reveals:
            step_line = reveal_line - 1
            static = revealed.get((name, reveal_line))
            precise = _parse_static(static) if static else None
            static_codes = [c for c in errors.get((name, step_line), []) if c.startswith("spmd")]
            where = f"{name}:{step_line}: {src.splitlines()[step_line - 1].strip()}"
            if rt.stop_line == step_line:
                if isinstance(rt.error, SpmdTypeError) and not rt.error.code.startswith("SPMD4"):
                    want = f"spmd-{REGISTRY[rt.error.code].slug}"
                    if static_codes:
                        stats["both reject"] += 1
                        if static_codes != [want]:
                            problems.append(f"{where}: runtime {rt.error.code} ({want}), plugin "
                                            f"{static_codes}")
                    elif precise is not None:
                        problems.append(f"{where}: runtime raised {rt.error.code} "
                                        f"({rt.error.headline}); the plugin accepted it as {precise}")
                    else:
                        stats["runtime rejects, plugin: state unknown"] += 1
                else:
                    stats["stopped by a non-spmdtyped error"] += 1
                break
            if step_line not in _lines_reached(rt, reveals):
                break
            if static_codes:
                problems.append(f"{where}: the plugin reports {static_codes}; the runtime accepted it "
                                f"as {rt.types.get(reveal_line)}")
                break
            if precise is None:
                stats["state unknown statically"] += 1
                continue
            stats["precise"] += 1
            if precise != rt.types.get(reveal_line):
                problems.append(f"{where}: plugin {precise}, runtime {rt.types.get(reveal_line)}")
    print("\nplugin differential:", dict(stats))
    assert not problems, "\n".join(problems) + "\n--- mypy ---\n" + out
    assert stats["precise"] >= 3 * N_PROGRAMS // 2, stats
    assert stats["both reject"] >= 3, stats


def _lines_reached(rt: _Runtime, reveals: list[int]) -> set[int]:
    """Step lines whose value the runtime revealed."""
    return {r - 1 for r in reveals if r in rt.types}


# ---------------------------------------------------------------------------------------------
# Every added Python form x every state: `%`, `//`, `&`, `|`, `^`, `~`, `==`, `!=`, reflected
# operators with a Python scalar, `x.at[...].op(v)`. Runtime (one shard_map trace, int32
# values) and mypy with the plugin must give the same state or the same error code.

_STATES = {
    "Invariant": "st.wrap(c)",
    'Varying["dp"]': 'st.pvary(c, "dp")',
    'Varying["tp"]': 'st.pvary(c, "tp")',
    'Reduced["tp"]': 'st.pcast(c, "tp", to="reduced")',
    'Unreduced["tp"]': 'st.pcast(st.pvary(c, "tp"), "tp", to="unreduced")',
}
_PAIR_FORMS = ("x % y", "x // y", "x & y", "x | y", "x ^ y", "x == y", "x != y",
               "x.at[:].set(y)", "x.at[:].add(y)", "x.at[:].multiply(y)", "x.at[:].min(y)",
               "x.at[:].max(y)")
_ONE_FORMS = ("x % 3", "3 % x", "x // 2", "2 // x", "x & 1", "1 | x", "x ^ 1", "x == 0",
              "0 != x", "2 + x", "2.0 * x", "1 - x", "~x", "x.at[0].set(1)", "x.at[0].add(1)")


def _surface_cases() -> list[tuple[str, str, str]]:
    """(form, x's hint, y's hint) for every form and state (pairs: every pair of states)."""
    out = [(f, hx, hy) for f in _PAIR_FORMS for hx in _STATES for hy in _STATES]
    out += [(f, hx, "Invariant") for f in _ONE_FORMS for hx in _STATES]
    return out


def test_plugin_agrees_with_runtime_on_every_form(mesh_dp_tp: Any) -> None:
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    cases = _surface_cases()
    lines = ["import spmdtyped as st", "from spmdtyped import Invariant, Reduced, Unreduced, Varying", ""]
    reveal_at: dict[int, int] = {}
    for k, (form, hx, hy) in enumerate(cases):
        lines += [f"def case_{k}(x: {hx}, y: {hy}) -> None:", f"    reveal_type({form})", ""]
        reveal_at[len(lines) - 1] = k
    tmp = Path(tempfile.mkdtemp(prefix="spmdtyped-surface-"))
    (tmp / "surface.py").write_text("\n".join(lines) + "\n")
    cfg = mypy_config(tmp, plugin=True, extra=f"[spmdtyped]\njax = {_jax_setting()}\n")
    _, out = run_mypy([tmp / "surface.py"], cfg, CACHE / "diff", cwd=tmp)
    static: dict[int, tuple[list[str], str | None]] = {k: ([], None) for k in range(len(cases))}
    for line in out.splitlines():
        if (m := _REVEAL.match(line)) and int(m.group("line")) in reveal_at:
            static[reveal_at[int(m.group("line"))]] = (static[reveal_at[int(m.group("line"))]][0],
                                                       m.group("type"))
        elif (m := _ERROR.match(line)) and int(m.group("line")) in reveal_at and \
                m.group("code").startswith("spmd"):
            static[reveal_at[int(m.group("line"))]][0].append(m.group("code"))

    runtime: dict[int, _rules.SpmdType | str | None] = {}

    def body(c: Any) -> Any:
        values = {h: eval(src, {"st": st, "c": c}) for h, src in _STATES.items()}  # noqa: S307
        for k, (form, hx, hy) in enumerate(cases):
            try:
                runtime[k] = st.typeof(eval(form, {"x": values[hx], "y": values[hy]}))  # noqa: S307
            except SpmdTypeError as e:
                runtime[k] = e.code
            except Exception:  # noqa: BLE001 - JAX's own limits: not a state question
                runtime[k] = None
        return c

    f = st.shard_map(body, mesh=mesh_dp_tp, in_specs=P(), out_specs=P())
    jax.eval_shape(f, jax.ShapeDtypeStruct((8,), jnp.int32))

    stats: collections.Counter[str] = collections.Counter()
    problems = []
    for k, (form, hx, hy) in enumerate(cases):
        codes, revealed = static[k]
        rt = runtime.get(k)
        where = f"{form} with x: {hx}, y: {hy}"
        if rt is None or rt == "SPMD901":
            stats["runtime: not a state outcome"] += 1
        elif isinstance(rt, str):
            want = f"spmd-{REGISTRY[rt].slug}"
            stats["both reject"] += codes == [want]
            if codes != [want]:
                problems.append(f"{where}: runtime {rt} ({want}), plugin {codes or revealed}")
        else:
            precise = _parse_static(revealed) if revealed else None
            stats["same state"] += precise == rt
            if codes or precise != rt:
                problems.append(f"{where}: runtime {rt}, plugin {codes or revealed}")
    print("\nsurface differential:", dict(stats), "of", len(cases))
    assert not problems, "\n".join(problems)
    assert stats["same state"] >= len(cases) // 3 and stats["both reject"] >= len(cases) // 5, stats
