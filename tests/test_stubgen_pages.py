"""Every documentation page's Python under pyright with the generated stub (issue 23, the editor
tier): 0 errors attributable to spmdtyped.

Each page's ```python blocks (`test_docs.python_blocks`, the one collection of the pages' code)
are one module, in page order, with the axis vocabulary appended (`dp: TypeAlias =
Literal["dp"]`, docs/pyright.md; appended so that line numbers stay). The modules are checked
twice, with the stub of `stubgen --axes dp,tp,sp` (the pages' axes) in `typings/` and without it
(the package's own static view). Many blocks are fragments (`mesh`, `x` defined elsewhere, a
`return` outside a function) and pyright reports those in both runs.

The attribution rule: an error of the stub run is spmdtyped's when the run without the stub has
no error of the same rule on that line, or when its message names an SPMD code (a deprecation
of the stub). A line marked as wrong on purpose, by a comment naming an SPMD code (`# SPMD101`,
`# raises SPMD103`), `# error` or `# expect:`, may have errors; a `# error` line must have one.
"""

from __future__ import annotations

import collections
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import pyright_or_skip
from test_docs import PAGES, _page_id, python_blocks

from spmdtyped._stubgen import vocabulary, write

REPO = Path(__file__).resolve().parent.parent
AXES = ("dp", "tp", "sp")
#: a comment that says the line is wrong on purpose
MARKED = re.compile(r"#.*(?:\bSPMD\d{3}\b|#\s*error\b|#\s*expect:)")
SPMD_CODE = re.compile(r"\bSPMD\d{3}\b")

Diag = tuple[str, int, str, str]  # (module, line, rule, message)

#: the stub's known false errors on the pages, by module and source line (stripped), with why;
#: the test holds this list equal to what pyright reports, so a fix shows as a failure here
KNOWN = {
    # an unannotated parameter is `Unknown`: pyright reports a deprecation when any overload
    # the argument may match is deprecated (docs/pyright.md, "Values pyright sees as Any")
    ("page_refinement.py", "h = st.nn.gelu(x @ w1)             # Typed[Shard['dp', -2], Shard['tp', -1]]"):
        "unannotated mlp(x, w1, w2, b2)",
    ("page_refinement.py", "h = st.nn.gelu(x @ w1)"): "unannotated mlp_fixed(x, w1, w2, b2)",
    ("page_refinement.py", 'return st.psum(h @ w2, "tp") + b2  # reduce the partial sums, then add the bias once'):
        "unannotated mlp_fixed(x, w1, w2, b2)",
    ("page_runtime.py", 'y = jax.jit(st.shard_map(lambda x: st.psum(x.sum(0), "dp"), mesh=mesh, in_specs=P("dp"),'):
        "a lambda's parameter",
}


def modules() -> dict[str, str]:
    """{module file name: the page's blocks, the vocabulary appended}."""
    vocab = "\nimport typing as _typing\n" + "".join(
        f"{a}: _typing.TypeAlias = _typing.Literal[{a!r}]\n" for a in AXES)
    out = {}
    for page in PAGES:
        blocks = [b for _run, b in python_blocks(page)]
        if blocks:
            name = "page_" + re.sub(r"\W", "_", _page_id(page).removesuffix(".md")) + ".py"
            text = "\n".join(blocks)
            # a page that imports the vocabulary (docs/pyright.md) gets `axes.py`, as written
            # by `stubgen --vocab axes.py`
            out[name] = text if "from axes import" in text else text + vocab
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Diag]]:
    """{"stub": errors, "plain": errors}: the two pyright runs, side by side."""
    exe = pyright_or_skip()
    procs = {}
    for leg in ("stub", "plain"):
        d = tmp_path_factory.mktemp(leg)
        if leg == "stub":
            write(AXES, d / "typings")
        for name, text in modules().items():
            (d / name).write_text(text)
        (d / "axes.py").write_text(vocabulary(AXES))
        # extraPaths: the checkout's package (the plain leg's static view) before site-packages
        (d / "pyrightconfig.json").write_text(json.dumps({
            "reportDeprecated": "error", "exclude": ["typings"], "pythonVersion": "3.11",
            "extraPaths": [str(REPO)]}))
        procs[leg] = subprocess.Popen([exe, "--outputjson", "--pythonpath", sys.executable],
                                      cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True)
    out: dict[str, list[Diag]] = {}
    for leg, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        try:
            report = json.loads(stdout)
        except json.JSONDecodeError:
            pytest.skip(f"pyright could not start (offline?): {(stdout + stderr)[-500:]}")
        out[leg] = [(Path(d["file"]).name, d["range"]["start"]["line"] + 1, d.get("rule", "?"),
                     d["message"])
                    for d in report["generalDiagnostics"] if d["severity"] == "error"]
    return out


def _marked(name: str, line: int, texts: dict[str, str]) -> bool:
    return bool(MARKED.search(texts[name].splitlines()[line - 1]))


def attributable(runs: dict[str, list[Diag]]) -> list[Diag]:
    """The stub run's errors that are spmdtyped's (the module docstring's rule), marked lines
    left out."""
    texts = modules()
    plain = collections.Counter((n, ln, rule) for n, ln, rule, _ in runs["plain"])
    found = []
    for n, ln, rule, msg in runs["stub"]:
        if _marked(n, ln, texts):
            continue
        if plain[(n, ln, rule)] > 0 and not SPMD_CODE.search(msg):
            plain[(n, ln, rule)] -= 1
            continue
        found.append((n, ln, rule, msg))
    return found


def test_every_page_with_python_is_checked() -> None:
    names = modules()
    assert len(names) >= 10 and "page_pyright.py" in names and "page_static.py" in names, names
    # the vocabulary holds every axis the pages name
    used = set(re.findall(r"""["'](\w+)["']""", "".join(names.values())))
    assert {"dp", "tp", "sp"} <= used and not {"fsdp", "ep", "pp"} & used


def test_no_error_attributable_to_spmdtyped(runs: dict[str, list[Diag]]) -> None:
    texts = modules()
    found = attributable(runs)
    known = {(n, texts[n].splitlines()[ln - 1].strip()) for n, ln, _rule, _msg in found}
    unknown = [(n, ln, rule, msg) for n, ln, rule, msg in found
               if (n, texts[n].splitlines()[ln - 1].strip()) not in KNOWN]
    assert not unknown, "\n".join(f"{n}:{ln} [{rule}] {msg}" for n, ln, rule, msg in unknown)
    # each known false error is still there (when the stub learns it, drop it from KNOWN)
    assert known == set(KNOWN), set(KNOWN) ^ known


def test_marked_error_lines_are_errors(runs: dict[str, list[Diag]]) -> None:
    """`# error` lines (docs/pyright.md's misuse block) are errors of the stub, with an SPMD code
    (which one at these three axes: test_stubgen_docs.py checks the page at its own two), and
    not without it (the rule tells the stub's errors apart)."""
    texts = modules()
    stub = collections.defaultdict(list)
    for n, ln, _rule, msg in runs["stub"]:
        stub[(n, ln)].append(msg)
    plain = {(n, ln) for n, ln, _rule, _msg in runs["plain"]}
    checked = 0
    for name, text in texts.items():
        for k, line in enumerate(text.splitlines(), 1):
            if re.search(r"#\s*error\b", line):
                assert any(SPMD_CODE.search(msg) for msg in stub[(name, k)]), (name, k, stub)
                assert (name, k) not in plain, (name, k)
                checked += 1
    assert checked >= 5

