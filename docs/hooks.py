"""mkdocs hooks: every table of rules and the error catalogue, generated at build time.

Nothing here encodes a rule. The tables call `spmdtyped._rules` (`axis_op`, `combine`,
`in_spec_type`, `check_out_spec`, `cotangent`) on `SpmdType`s and print what comes back, for
both JAX feature sets (`_rules.JAX_0_10`, `_rules.JAX_0_12`); the error pages are
`spmdtyped._errors.explain(code)` for every code of `_errors.REGISTRY`. See docs/README.md.

- `on_config`: one nav entry per registry code under "Errors".
- `on_files`: the generated pages `errors/index.md` and `errors/SPMD###.md` (and a pending
  page for `static.md` / `porting.md` until those files exist).
- `on_page_markdown`: `<!-- gen:NAME [ARG] -->` markers are replaced by `GENERATORS[NAME]`.

`tests/test_docs.py` imports this file to check the same functions.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import itertools
import posixpath
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from spmdtyped import _errors, _rules  # noqa: E402  (no JAX is imported)
from spmdtyped._rules import LITERAL, SpmdType, State  # noqa: E402

FEATURES = (_rules.JAX_0_10, _rules.JAX_0_12, _rules.JAX_0_12_1, _rules.CONSERVATIVE)
STATES = (State.INVARIANT, State.VARYING, State.UNREDUCED, State.REDUCED)
AXIS = "a"  # the one axis of the abstract tables
MARKER = re.compile(r"^<!-- gen:([a-z0-9-]+)(?: (\S+))? -->[ \t]*$", re.M)


# --------------------------------------------------------------------------- small helpers


class Ctx:
    """Where a generated table goes: links to error pages are relative to the page."""

    def __init__(self, src_uri: str = "index.md") -> None:
        self.dir = posixpath.dirname(src_uri)

    def code(self, code: str) -> str:
        target = posixpath.relpath(f"errors/{code}.md", self.dir or ".")
        title = _errors.REGISTRY[code].title.replace('"', "'") if code in _errors.REGISTRY else ""
        return f'[{code}]({target} "{title}")'


def typ(state: State, axis: str = AXIS, kind: str | None = None) -> SpmdType:
    """A value in `state` on `axis` (Invariant elsewhere)."""
    return SpmdType().with_states((axis,), state).replace(
        unreduced_kind=kind if state is State.UNREDUCED else None)


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    def esc(cell: str) -> str:
        return str(cell).replace("|", "\\|").replace("\n", "<br>")

    out = ["| " + " | ".join(esc(h) for h in header) + " |",
           "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def prose(text: str) -> str:
    """Text from the rule table as Markdown: code spans kept, emphasis/HTML/link characters
    outside them escaped (`r * 2.0`, `**`, `<=`, `.at[].set` must print as written)."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = (parts[i].replace("\\", "\\\\").replace("*", "\\*").replace("_", "\\_")
                    .replace("[", "\\[").replace("<", "&lt;").replace(">", "&gt;"))
    return "`".join(parts)


class Outcome:
    """What one rule call gave: a type, or an error code (and JAX's result under st.allow)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.type: SpmdType | None = None
        self.code: str | None = None
        self.extra = ""
        self.allowed: Outcome | None = None
        try:
            res = fn()
        except _errors.SpmdTypeError as e:
            self.code = e.code
            entry = _errors.REGISTRY.get(e.code)
            if entry is not None and entry.strict and not _errors.allowed(e.code):
                with _errors.allow(e.code):
                    self.allowed = Outcome(fn)
            return
        if isinstance(res, _rules.Combined):
            self.type = res.type
            if res.literal_reduced:
                self.extra = f"literal cast to Reduced[{', '.join(map(repr, sorted(res.literal_reduced)))}]"
        else:
            self.type = res

    def key(self) -> tuple[object, ...]:
        return (self.type, self.code, self.extra, self.allowed.key() if self.allowed else None)

    def render(self, ctx: Ctx, *, abstract: bool = False) -> str:
        if self.code is not None:
            s = f"✗ {ctx.code(self.code)}"
            if self.allowed is not None and self.allowed.type is not None:
                s += f" (JAX: {self.allowed.render(ctx, abstract=abstract)})"
            return s
        assert self.type is not None
        if abstract:
            s = self.type.state(AXIS).title
        else:
            s = f"`{self.type}`"
        return f"{s}, {self.extra}" if self.extra else s


def versions(fn: Callable[[_rules.Features], Any]) -> list[Outcome]:
    return [Outcome(lambda f=f: fn(f)) for f in FEATURES]


def cell(outs: list[Outcome], ctx: Ctx, *, abstract: bool = False) -> str:
    first = outs[0].render(ctx, abstract=abstract)
    if all(o.key() == outs[0].key() for o in outs):
        return first
    return "<br>".join(f"{f.name}: {o.render(ctx, abstract=abstract)}" for f, o in zip(FEATURES, outs, strict=True))


def op_label(name: str) -> str:
    """The spmdtyped spelling of an AXIS_OPS row."""
    for prefix, func in (("pcast_", "st.pcast"), ("all_gather_", "st.all_gather")):
        if name.startswith(prefix):
            return f'{func}(x, axis, to="{name.removeprefix(prefix)}")'
    if name == "all_gather":
        return 'st.all_gather(x, axis)  (to="varying")'
    return f"st.{name}(x, axis)"


def axis_input(rule: _rules.AxisOp, state: State, axis: str = AXIS, base: SpmdType | None = None) -> SpmdType:
    """An input in `state` on `axis`; an Unreduced input pends the reduction the op completes."""
    kind = rule.unreduced_kind if state is State.UNREDUCED and rule.unreduced_kind else None
    t = (base or SpmdType()).with_states((axis,), state)
    return t.replace(unreduced_kind=kind) if state is State.UNREDUCED else t


# --------------------------------------------------------------------------- collectives and casts


def gen_axis_ops(ctx: Ctx, which: str = "collectives") -> str:
    casts = which == "casts"
    rows = []
    for name, rule in _rules.AXIS_OPS.items():
        if rule.is_cast != casts:
            continue
        cells = [cell(versions(lambda f, s=s, name=name, rule=rule: _rules.axis_op(name, axis_input(rule, s), (AXIS,), f)),
                      ctx, abstract=True) for s in STATES]
        rows.append([f"`{op_label(name)}`", *cells, prose(rule.doc)])
    head = ["op", *(f"input {s.title}" for s in STATES), "what it does"]
    return table(head, rows)


def gen_axis_examples(ctx: Ctx) -> str:
    base = SpmdType(varying={"dp"})
    inputs = [base.with_states(("tp",), s) for s in STATES]
    rows = []
    for name, rule in _rules.AXIS_OPS.items():
        cells = []
        for s in STATES:
            t = axis_input(rule, s, "tp", base)
            cells.append(cell(versions(lambda f, t=t, name=name: _rules.axis_op(name, t, ("tp",), f)), ctx))
        call = op_label(name).replace("axis", '"tp"')
        rows.append([f"`{call}`", *cells])
    return table(["call", *(f"x: `{t}`" for t in inputs)], rows)


# --------------------------------------------------------------------------- elementwise ops


def _rule_key(r: _rules.ElementwiseRule) -> tuple[object, ...]:
    return (r.linearity, r.on_unreduced, r.on_reduced, r.unreduced_feature, r.reduced_feature)


def _same_rule(name: str) -> list[str]:
    key = _rule_key(_rules.ELEMENTWISE[name])
    return [n for n, r in _rules.ELEMENTWISE.items() if _rule_key(r) == key and n != name]


BINARY_SHOWN = ("add", "sub", "mul", "div", "matmul", "maximum")
_NARY_NONLINEAR = _rules.NONLINEAR_NARY
_NARY = (_rules.Linearity.ADDITIVE, _rules.Linearity.MULTIPLICATIVE, _rules.Linearity.DIVIDE,
         _rules.Linearity.DOT, _rules.Linearity.SELECT)


def _is_nary(name: str) -> bool:
    return _rules.ELEMENTWISE[name].linearity in _NARY or name in _NARY_NONLINEAR


OPERANDS: tuple[tuple[str, Any], ...] = tuple(
    [(s.title, typ(s)) for s in STATES] + [("literal", LITERAL)])


def _pair_rows(ctx: Ctx, rule: Callable[[Any, Any, Any], Any]) -> list[list[str]]:
    """One table row per left operand of OPERANDS, one cell per right operand: `rule(features,
    lhs, rhs)` under both JAX versions (two literals: an empty cell)."""
    rows = []
    for lname, lhs in OPERANDS:
        row = [f"**{lname}**"]
        for _rname, rhs in OPERANDS:
            if lhs is LITERAL and rhs is LITERAL:
                row.append("")
                continue
            row.append(cell(versions(lambda f, a=lhs, b=rhs: rule(f, a, b)), ctx, abstract=True))
        rows.append(row)
    return rows


def gen_binary(ctx: Ctx) -> str:
    parts = []
    for name in BINARY_SHOWN:
        if name not in _rules.ELEMENTWISE:
            continue
        rows = _pair_rows(ctx, lambda f, a, b, name=name: _rules.combine(name, [a, b], f))
        same = _same_rule(name)
        also = f" Same rule: {', '.join(f'`{n}`' for n in same)}." if same else ""
        parts.append(f"#### `{name}`\n\nRows: left operand; columns: right operand "
                     f"(states on one axis).{also}\n\n"
                     + table([f"{name}", *(n for n, _ in OPERANDS)], rows))
    return "\n\n".join(parts)


def gen_where(ctx: Ctx) -> str:
    cond = SpmdType()
    rows = _pair_rows(ctx, lambda f, a, b: _rules.combine("where", [cond, a, b], f))
    return table(["where(c, x, y): x \\ y", *(n for n, _ in OPERANDS)], rows)


def gen_unary(ctx: Ctx) -> str:
    groups: dict[tuple[object, ...], tuple[list[str], list[str]]] = {}
    for name in _rules.ELEMENTWISE:
        if _is_nary(name):
            continue
        outs = [versions(lambda f, s=s, name=name: _rules.unary(name, typ(s), f)) for s in STATES]
        key = tuple(o.key() for v in outs for o in v)
        if key not in groups:
            groups[key] = ([], [cell(v, ctx, abstract=True) for v in outs])
        groups[key][0].append(name)
    rows = [[", ".join(f"`{n}`" for n in names), *cells] for names, cells in groups.values()]
    return table(["ops", *(f"input {s.title}" for s in STATES)], rows)


def gen_nary_ops(ctx: Ctx) -> str:
    by: dict[str, list[str]] = {}
    for name, rule in _rules.ELEMENTWISE.items():
        if _is_nary(name):
            by.setdefault(rule.linearity.value, []).append(f"`{name}`")
    return table(["linearity", "ops"], [[k, ", ".join(v)] for k, v in by.items()])


def gen_literals(ctx: Ctx) -> str:
    exprs = [("x + 2.0", "add", False), ("2.0 + x", "add", True), ("x - 2.0", "sub", False),
             ("x * 2.0", "mul", False), ("2.0 * x", "mul", True), ("x / 2.0", "div", False),
             ("2.0 / x", "div", True)]
    rows = []
    for text, name, lit_first in exprs:
        row = [f"`{text}`"]
        for s in STATES:
            ops = [LITERAL, typ(s)] if lit_first else [typ(s), LITERAL]
            row.append(cell(versions(lambda f, ops=ops, name=name: _rules.combine(name, ops, f)), ctx,
                            abstract=True))
        rows.append(row)
    return table(["expression", *(f"x {s.title}" for s in STATES)], rows)


# --------------------------------------------------------------------------- boundary, autodiff


def gen_in_specs(ctx: Ctx) -> str:
    rows = []
    for spec, kw in (('P("dp")', {"partitioned": ("dp",)}),
                     ('P(None, "dp")', {"partitioned": ("dp",)}),
                     ('P(unreduced={"dp"})', {"partitioned": (), "unreduced": ("dp",)}),
                     ('P(reduced={"dp"})', {"partitioned": (), "reduced": ("dp",)}),
                     ("P()", {"partitioned": ()})):
        rows.append([f"`{spec}`", f"`{_rules.in_spec_type(manual=('dp', 'tp'), **kw)}`"])
    return table(["in_specs entry (mesh axes dp, tp)", "the argument inside the function"], rows)


def gen_out_specs(ctx: Ctx) -> str:
    specs = (('P("a")', (AXIS,), (), ()), ('P(unreduced={"a"})', (), (AXIS,), ()),
             ('P(reduced={"a"})', (), (), (AXIS,)), ("P()", (), (), ()))
    rows = []
    for s in STATES:
        row = [f"**{s.title}**"]
        for spec, part, un, red in specs:
            o = Outcome(lambda s=s, part=part, un=un, red=red, spec=spec: _rules.check_out_spec(
                typ(s), part, un, red, (AXIS,), where="st.shard_map(f)", spec=spec))
            row.append("✓" if o.code is None else o.render(ctx))
        rows.append(row)
    return table(["output state \\ out_specs entry", *(f"`{s[0]}`" for s in specs)], rows)


def gen_cotangents(ctx: Ctx) -> str:
    return table(["value", "its cotangent (gradient)"],
                 [[s.title, _rules.cotangent(typ(s)).state(AXIS).title] for s in STATES])


# --------------------------------------------------------------------------- stricter / looser / versions


def gen_stricter(ctx: Ctx) -> str:
    rows = [[ctx.code(code), prose(what), prose(jax)] for code, what, jax in _rules.STRICTER_THAN_JAX]
    return table(["code", "spmdtyped rejects", "what JAX does"], rows)


def gen_looser(ctx: Ctx) -> str:
    return table(["spmdtyped accepts", "how"], [[prose(c) for c in r] for r in _rules.LOOSER_THAN_JAX])


def gen_strict_codes(ctx: Ctx) -> str:
    rows = [[ctx.code(c), f"`with st.allow({c!r}): ...`", e.title]
            for c, e in _errors.REGISTRY.items() if e.strict]
    return table(["code", "opt-out", "rule"], rows)


def gen_features(ctx: Ctx) -> str:
    import dataclasses

    rows = []
    for field in dataclasses.fields(_rules.Features):
        if field.name == "name":
            continue
        rows.append([f"`{field.name}`", *("yes" if getattr(f, field.name) else "no" for f in FEATURES),
                     prose(field.metadata["doc"])])
    return table(["`Features` flag", *(f.name for f in FEATURES), "meaning"], rows)


def version_differences() -> list[tuple[str, list[Outcome]]]:
    """Every rule call of the tables whose result differs between the JAX feature sets."""
    found: list[tuple[str, list[Outcome]]] = []

    def add(text: str, outs: list[Outcome]) -> None:
        if any(o.key() != outs[0].key() for o in outs):
            found.append((text, outs))

    for name, rule in _rules.AXIS_OPS.items():
        for s in STATES:
            t = axis_input(rule, s)
            add(f"`{op_label(name)}` on {t}",
                versions(lambda f, t=t, name=name: _rules.axis_op(name, t, (AXIS,), f)))
    for name in _rules.ELEMENTWISE:
        if _is_nary(name):
            if _rules.ELEMENTWISE[name].linearity is _rules.Linearity.SELECT:
                continue
            for (ln, a), (rn, b) in itertools.product(OPERANDS, OPERANDS):
                if a is LITERAL and b is LITERAL:
                    continue
                add(f"`{name}({ln}, {rn})`",
                    versions(lambda f, a=a, b=b, name=name: _rules.combine(name, [a, b], f)))
        else:
            for s in STATES:
                add(f"`{name}(x)` on {typ(s)}",
                    versions(lambda f, s=s, name=name: _rules.unary(name, typ(s), f)))
    return found


def gen_version_diff(ctx: Ctx) -> str:
    rows = [[text, *(o.render(ctx) for o in outs)] for text, outs in version_differences()]
    return table(["rule call", *(f.name for f in FEATURES)], rows)


# --------------------------------------------------------------------------- errors


def gen_error_index(ctx: Ctx) -> str:
    rows = [[ctx.code(c), f"`{e.mypy_code}`", f"`{e.category.__name__}`", e.title,
             "yes" if e.strict else ""] for c, e in _errors.REGISTRY.items()]
    return table(["code", "mypy error code", "exception", "title", "strict (opt-out)"], rows)


#: rule calls that raise each code, to show a real message on its page (codes without one,
#: such as those raised only at run time, show none)
MESSAGE_TRIGGERS: dict[str, Callable[[], object]] = {
    "SPMD101": lambda: _rules.axis_op("psum", SpmdType(reduced="dp"), ("dp",), op="st.psum"),
    "SPMD102": lambda: _rules.axis_op("all_gather", SpmdType(unreduced="tp"), ("tp",),
                                      op="st.all_gather"),
    "SPMD103": lambda: _rules.axis_op("psum", SpmdType(), ("dp",), op="st.psum"),
    "SPMD104": lambda: _rules.axis_op("psum", SpmdType(varying="dp"), ("dp", "tp"), op="st.psum"),
    "SPMD105": lambda: _rules.axis_op("pmean", SpmdType(varying="dp", unreduced="tp"), ("dp",),
                                      op="st.pmean"),
    "SPMD106": lambda: _rules.axis_op("pmax", SpmdType(unreduced="tp"), ("tp",), _rules.JAX_0_12,
                                      op="st.pmax"),
    "SPMD201": lambda: _rules.combine("add", [SpmdType(unreduced="tp"), SpmdType()],
                                      op="operator +"),
    "SPMD202": lambda: _rules.combine("tanh", [SpmdType(unreduced="tp")], op="st.numpy.tanh"),
    "SPMD203": lambda: _rules.combine("mul", [SpmdType(reduced="dp"), SpmdType()],
                                      op="operator *"),
    "SPMD204": lambda: _rules.combine("add", [SpmdType(reduced="dp"), SpmdType(reduced="tp")],
                                      op="operator +"),
    "SPMD205": lambda: _rules.combine("add", [SpmdType(varying=("dp", "tp")), SpmdType(reduced="dp")],
                                      op="operator +"),
    "SPMD301": lambda: _rules.axis_op("pcast_varying", SpmdType(varying="dp"), ("dp",),
                                      op="st.pcast"),
    "SPMD401": lambda: _rules.check_out_spec(SpmdType(varying="dp"), (), (), (), ("dp", "tp"),
                                             where="st.shard_map(f)", spec="P()"),
    "SPMD107": lambda: _rules.custom_op_type([SpmdType()], [{"tp": State.VARYING}],
                                             op="ring_allreduce", names=["x"]),
    "SPMD302": lambda: _rules.join_carry(SpmdType(unreduced="tp"), SpmdType(), op="st.fori_loop",
                                         what="init_val[0]"),
    "SPMD404": lambda: _rules.check_cotangent(SpmdType(reduced="dp"), SpmdType(reduced="dp"),
                                              op="st.vjp pullback"),
    "SPMD405": lambda: _rules.grad_loss_type(SpmdType(unreduced="tp"), op="st.grad"),
    "SPMD507": lambda: _rules.parse_states({"tp": "varyng"}, op="st.custom_op", what="requires"),
    "SPMD501": lambda: _rules.check_axes_known(("tpp",), "st.psum", ("dp", "tp")),
    "SPMD502": lambda: _rules.normalize_axes({"dp", "tp"}, "st.psum"),
    "SPMD503": lambda: _rules.check_axes_known(("tp",), "st.psum", ("dp",), ("dp", "tp")),
    "SPMD504": lambda: SpmdType(varying="dp", reduced="dp"),
    "SPMD505": lambda: _rules.pcast_op("invariant", "st.pcast"),
}

MSG_BEGIN, MSG_END = "<!-- example message -->", "<!-- /example message -->"


#: the mesh of the docs' examples (`jax.make_mesh((2, 4), ("dp", "tp"))`)
DOCS_MESH = {"dp": 2, "tp": 4}


def example_message(code: str, function: str | None = None) -> str | None:
    """The message of `code`'s trigger; with `function`, as raised while `st.shard_map` traces
    that function on `DOCS_MESH`."""
    trigger = MESSAGE_TRIGGERS.get(code)
    if trigger is None:
        return None
    try:
        if function is None:
            trigger()
        else:
            with _errors.error_context(function=function, mesh=DOCS_MESH):
                trigger()
    except _errors.SpmdTypeError as e:
        if e.code != code:
            raise AssertionError(f"docs/hooks.py: the example of {code} raised {e.code}") from e
        return str(e)
    raise AssertionError(f"docs/hooks.py: the example of {code} raised nothing")


def _link_related(text: str) -> str:
    return re.sub(r"^- (SPMD\d{3}):", r"- [\1](\1.md):", text, flags=re.M)


def error_page(code: str) -> str:
    """The page of `code`: `_errors.explain(code)` (related codes as links), with a real
    message of the code inserted before the wrong and the fixed code ("Example fix")."""
    page = _link_related(_errors.explain(code))
    msg = example_message(code)
    if msg is not None:
        section = (f"{MSG_BEGIN}\n## The message\n\nFor example (the fix and the values depend on "
                   f"the call):\n\n```text\n{msg}\n```\n{MSG_END}\n\n")
        page = page.replace("## Example fix", section + "## Example fix", 1)
    return page + (f"\n---\n\nThis page is `python -m spmdtyped explain {code}` "
                   f"(`st.explain({code!r})`).\n")


def error_index() -> str:
    return ("# Errors\n\nEvery `SpmdTypeError` has a code, and every code has a page: the "
            "rule in one sentence, the message, the wrong code and the fixed code, what it means, "
            "the fix and other solutions, when it happens, and related errors. The runtime message ends with a link to the page; "
            "`python -m spmdtyped explain SPMD###` prints the same text in a terminal, and the "
            "mypy plugin reports the code as `spmd-<slug>`.\n\n"
            "Codes marked *strict* are programs JAX accepts and computes wrongly or surprisingly; "
            "each has a one-line opt-out, `with st.allow(code): ...`.\n\n"
            + gen_error_index(Ctx("errors/index.md")) + "\n")


# --------------------------------------------------------------------------- examples, members


def _example_section(path: Path, heading: str | None, anchor: str) -> str:
    doc = (ast.get_docstring(ast.parse(path.read_text())) or "").strip()
    lines = doc.splitlines()
    rel = path.relative_to(ROOT).as_posix()
    if heading is None:  # an example: its docstring's first line is the heading
        heading, doc = (lines[0].rstrip(".") if lines else path.stem), "\n".join(lines[1:]).strip()
        head = f"## {heading} {{ #{anchor} }}"
    else:
        head = f"### {heading} {{ #{anchor} }}"
    return (f"{head}\n\n`{rel}`\n\n{doc}\n\n"
            f"```python title=\"{rel}\"\n--8<-- \"{rel}\"\n```")


def example_files() -> list[tuple[Path, Path | None]]:
    """(example, its broken variant or None) for every `examples/*.py` not starting with `_`."""
    out = []
    for path in sorted((ROOT / "examples").glob("*.py")):
        if path.name.startswith("_"):
            continue
        broken = ROOT / "examples" / "broken" / f"{path.stem}_broken.py"
        out.append((path, broken if broken.exists() else None))
    return out


def gen_examples(ctx: Ctx) -> str:
    files = example_files()
    if not files:
        return "!!! note \"Pending\"\n    No example has landed in `examples/` yet."
    parts = []
    for path, broken in files:
        parts.append(_example_section(path, None, path.stem))
        if broken is not None:
            parts.append(_example_section(broken, "The mistake it rules out", f"{path.stem}-broken"))
    return "\n\n".join(parts)


def public_names(module: str) -> list[str] | None:
    """The public names a module defines (its `__all__`, else its public top-level defs),
    read without importing it; `None` if the module does not exist."""
    path = ROOT / (module.replace(".", "/") + ".py")
    if not path.exists():
        return None
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                for t in node.targets):
            with contextlib.suppress(ValueError):
                return list(ast.literal_eval(node.value))
    return [n.name for n in tree.body
            if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and not n.name.startswith("_")]


def gen_members(ctx: Ctx, module: str = "") -> str:
    names = public_names(module)
    if names is None:
        return (f"!!! note \"Pending\"\n    `{module}` has not landed yet; this section fills in "
                f"from its docstrings when it does.")
    if not names:
        return ""
    return "\n\n".join(f"::: {module}.{n}" for n in names)


def lazy_members(package: str) -> list[str]:
    """`package.module.name` of every name a package's `_LAZY` table loads (read without
    importing the package)."""
    path = ROOT / package.replace(".", "/") / "__init__.py"
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_LAZY"
                                                for t in node.targets):
            table = ast.literal_eval(node.value)
            # relative module names, as `importlib.import_module(mod, package)` reads them
            return [f"{importlib.util.resolve_name(mod, package)}.{name}"
                    for name, mod in sorted(table.items())]
    return []


def gen_lazy(ctx: Ctx, package: str = "") -> str:
    return "\n\n".join(f"::: {path}" for path in lazy_members(package))


def gen_rules(ctx: Ctx, module: str = "spmdtyped.numpy") -> str:
    """A typed function module's functions and their rules (`module.RULES`). Imports the
    module, hence JAX: the functions are built at import."""
    mod = importlib.import_module(module)
    short = "st." + module.removeprefix("spmdtyped.")
    rows = []
    for name, rule in sorted(mod.RULES.items()):
        r = _rules.ELEMENTWISE.get(rule)
        kind = r.linearity.value if r is not None else "constructor"
        rows.append([f"`{short}.{name}`", f"`{rule}`", kind])
    return table(["function", "rule", "class"], rows)


def gen_message(ctx: Ctx, arg: str = "SPMD101") -> str:
    """`<!-- gen:message SPMD101 -->`, or `SPMD101@broken` for the message as raised inside
    `st.shard_map(broken)` on the docs' mesh."""
    code, _, function = arg.partition("@")
    msg = example_message(code, function or None)
    if msg is None:
        raise KeyError(f"docs/hooks.py: no example message for {code}")
    return f"```text\n{msg}\n```"


GENERATORS: dict[str, Callable[..., str]] = {
    "message": gen_message,
    "collectives": lambda ctx: gen_axis_ops(ctx, "collectives"),
    "casts": lambda ctx: gen_axis_ops(ctx, "casts"),
    "axis-examples": gen_axis_examples,
    "binary": gen_binary,
    "nary-ops": gen_nary_ops,
    "where": gen_where,
    "unary": gen_unary,
    "literals": gen_literals,
    "in-specs": gen_in_specs,
    "out-specs": gen_out_specs,
    "cotangents": gen_cotangents,
    "stricter": gen_stricter,
    "looser": gen_looser,
    "strict-codes": gen_strict_codes,
    "features": gen_features,
    "version-diff": gen_version_diff,
    "error-index": gen_error_index,
    "examples": gen_examples,
    "members": gen_members,
    "lazy": gen_lazy,
    "rules": gen_rules,
}


def _load_refine_tables() -> Any:
    """docs/_refine_tables.py (the Shard/Partial/Rep tables), loaded by path as this file is."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("spmdtyped_docs_refine_tables",
                                                  Path(__file__).with_name("_refine_tables.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_REFINE = _load_refine_tables()
for _name, _gen in _REFINE.GENERATORS.items():
    GENERATORS[_name] = (lambda g: lambda ctx, arg=None: g(ctx.code, arg) if arg else g(ctx.code))(_gen)
MESSAGE_TRIGGERS.update(_REFINE.TRIGGERS)


AUTODOC = re.compile(r"^::: (spmdtyped(?:\.\w+)+)[ \t]*$", re.M)


def public_spelling(path: str) -> str | None:
    """`spmdtyped._ops.collectives.psum` -> `st.psum`; `spmdtyped.adapters._infer.infer` ->
    `st.adapters.infer`; None for a path with no private part (already public)."""
    parts = path.split(".")
    private = [i for i, p in enumerate(parts[1:-1], 1) if p.startswith("_")]
    if not private:
        return None
    # the public packages above the first private part, then the name
    return ".".join(["st", *parts[1:private[0]], parts[-1]])


def public_headings(markdown: str) -> str:
    """Give each `::: spmdtyped._private.name` directive its public heading (`st.name`)."""
    lines = markdown.split("\n")
    out: list[str] = []
    for i, line in enumerate(lines):
        out.append(line)
        m = AUTODOC.match(line)
        name = public_spelling(m.group(1)) if m else None
        if name is None:
            continue
        opts = f'      heading: "{name}"\n      toc_label: "{name}"'
        if i + 1 < len(lines) and lines[i + 1].strip() == "options:":
            lines[i + 1] = lines[i + 1] + "\n" + opts
        else:
            out.append("    options:\n" + opts)
    return "\n".join(out)


def expand(markdown: str, src_uri: str) -> str:
    ctx = Ctx(src_uri)

    def sub(m: re.Match[str]) -> str:
        name, arg = m.group(1), m.group(2)
        if name not in GENERATORS:
            raise KeyError(f"{src_uri}: unknown generator <!-- gen:{name} -->; known: "
                           f"{', '.join(GENERATORS)}")
        return GENERATORS[name](ctx, arg) if arg else GENERATORS[name](ctx)

    return public_headings(MARKER.sub(sub, markdown))


# --------------------------------------------------------------------------- mkdocs events


def on_config(config: Any) -> Any:
    for entry in config["nav"] or []:
        if isinstance(entry, dict) and "Errors" in entry:
            pages = [p for p in entry["Errors"] if not (isinstance(p, dict) and
                                                       any(k in _errors.REGISTRY for k in p))]
            entry["Errors"] = pages + [{code: f"errors/{code}.md"} for code in _errors.REGISTRY]
    return config


#: pages other work writes; until a file lands, the build uses a generated "pending" page
PAGES_WRITTEN_ELSEWHERE = {
    "static.md": ("Static checking", "the mypy plugin, the axis vocabulary, pyright"),
    "porting.md": ("Porting guide", "porting existing `jax.shard_map` code"),
}


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for src, (title, what) in PAGES_WRITTEN_ELSEWHERE.items():
        if files.get_file_from_path(src) is None:
            files.append(File.generated(config, src, content=(
                f"# {title}\n\n!!! note \"Pending\"\n    This page ({what}) has not been "
                f"written yet.\n")))
    for src in ["errors/index.md", *(f"errors/{code}.md" for code in _errors.REGISTRY)]:
        if files.get_file_from_path(src) is not None:
            raise FileExistsError(f"docs/{src}: error pages are generated from "
                                  f"spmdtyped._errors.REGISTRY by docs/hooks.py; remove the file")
    files.append(File.generated(config, "errors/index.md", content=error_index()))
    for code in _errors.REGISTRY:
        files.append(File.generated(config, f"errors/{code}.md", content=error_page(code)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return expand(markdown, page.file.src_uri)
