"""The documentation site: error catalogue, API coverage, runnable blocks, mypy on the
getting-started model, and `mkdocs build --strict` (see docs/README.md)."""

from __future__ import annotations

import html
import importlib
import importlib.util
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import spmdtyped as st
from spmdtyped import __main__ as cli
from spmdtyped import _errors

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _load_hooks():
    spec = importlib.util.spec_from_file_location("spmdtyped_docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = _load_hooks()
PAGES = sorted(p for p in DOCS.rglob("*.md") if p.name != "README.md")


def _page_id(p: Path) -> str:
    return p.relative_to(DOCS).as_posix()


# ----------------------------------------------------------------------------- error catalogue


@pytest.mark.parametrize("code", sorted(_errors.REGISTRY))
def test_every_code_has_an_explain_text_and_a_page(code):
    entry = _errors.REGISTRY[code]
    text = st.explain(code)
    assert text.startswith(f"# {code}: {entry.title}")
    for section in ("## What it means", "## Solutions", "## Example fix", "## When it happens"):
        assert section in text, (code, section)
    assert entry.before in text and entry.after in text
    if entry.strict:
        assert f"with st.allow({code!r})" in text

    page = hooks.error_page(code)
    # the page is the explain text: drop the inserted example message and the related links
    stripped = re.sub(re.escape(hooks.MSG_BEGIN) + r".*?" + re.escape(hooks.MSG_END) + r"\n\n", "",
                      page, flags=re.S)
    stripped = re.sub(r"^- \[(SPMD\d{3})\]\(SPMD\d{3}\.md\):", r"- \1:", stripped, flags=re.M)
    assert stripped.startswith(text)
    for related in entry.related:
        assert f"[{related}]({related}.md)" in page
        assert related in _errors.REGISTRY


@pytest.mark.parametrize("code", sorted(_errors.REGISTRY))
def test_cli_explain_prints_the_page(code, capsys):
    assert cli.main(["explain", code]) == 0
    assert capsys.readouterr().out.strip() == st.explain(code).strip()


def test_error_pages_have_the_url_the_messages_print():
    site_url = re.search(r"^site_url: (\S+)$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert site_url is not None
    assert _errors.DOCS_URL == site_url.group(1) + "errors/"
    assert re.search(r"^use_directory_urls: true$", (ROOT / "mkdocs.yml").read_text(), re.M)


def test_every_code_is_in_the_nav():
    config = {"nav": [{"Home": "index.md"}, {"Errors": ["errors/index.md"]}]}
    hooks.on_config(config)
    errors = config["nav"][1]["Errors"]
    assert errors[0] == "errors/index.md"
    assert [next(iter(e)) for e in errors[1:]] == list(_errors.REGISTRY)
    hooks.on_config(config)  # idempotent (mkdocs serve reloads)
    assert len(config["nav"][1]["Errors"]) == len(_errors.REGISTRY) + 1


@pytest.mark.parametrize("code", sorted(hooks.MESSAGE_TRIGGERS))
def test_example_messages_raise_their_code(code):
    assert code in _errors.REGISTRY
    msg = hooks.example_message(code)
    assert msg is not None and f"[{code}]" in msg and f"errors/{code}/" in msg


def test_getting_started_message_is_the_runtime_one(mesh_dp_tp):
    """getting-started.md shows hooks.example_message("SPMD101") as what its program raises."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    assert "<!-- gen:message SPMD101@broken -->" in (DOCS / "getting-started.md").read_text()

    @st.shard_map(mesh=mesh_dp_tp, in_specs=P("dp"), out_specs=P())
    def broken(w_shard):
        return st.psum(st.all_gather(w_shard, "dp", to="reduced", tiled=True), "dp")

    w = jax.device_put(jax.numpy.ones((16, 8)), NamedSharding(mesh_dp_tp, P("dp")))
    with pytest.raises(st.SpmdTypeError) as info:
        broken(w)
    assert str(info.value) == hooks.example_message("SPMD101", function="broken")
    assert "in broken (mesh dp=2, tp=4)" in str(info.value).splitlines()[0]


def test_error_index_lists_every_code():
    index = hooks.error_index()
    for code in _errors.REGISTRY:
        assert f"[{code}](SPMD" in index or f"[{code}]({code}.md" in index


# ----------------------------------------------------------------------------- API coverage


def _documented() -> dict[str, list[str]]:
    """name -> the `:::` paths (or anchors) that document it, over every page."""
    found: dict[str, list[str]] = {}
    for page in PAGES:
        text = page.read_text()
        paths = re.findall(r"^::: ([\w.]+)\s*$", text, re.M)
        for name, arg in hooks.MARKER.findall(text):
            if name == "members":
                paths += [f"{arg}.{n}" for n in hooks.public_names(arg) or []]
            elif name == "lazy":
                paths += hooks.lazy_members(arg)
        for path in paths:
            found.setdefault(path.rsplit(".", 1)[-1], []).append(path)
        anchors = re.findall(r"^#+ .*\{ #(\w+) \}\s*$", text, re.M)
        anchors += re.findall(r'<a id="(\w+)"></a>', text)
        for anchor in anchors:
            found.setdefault(anchor, []).append(f"#{anchor}")
    return found


def _resolve(path: str):
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


def test_every_public_name_is_documented():
    documented = _documented()
    missing = [n for n in st.__all__ if n not in documented]
    assert not missing, f"public names without a docs entry (add them to docs/reference.md): {missing}"
    for name in st.__all__:
        paths = [p for p in documented[name] if not p.startswith("#")]
        if paths:
            assert any(_resolve(p) is getattr(st, name) for p in paths), (name, paths)


def test_every_public_submodule_is_documented():
    text = "\n".join(p.read_text() for p in PAGES)
    for sub in st._SUBMODULES:
        assert re.search(rf"^::: spmdtyped\.{sub}\s*$", text, re.M), f"spmdtyped.{sub} has no docs entry"


def test_every_autodoc_directive_resolves():
    for page in PAGES:
        for path in re.findall(r"^::: ([\w.]+)\s*$", page.read_text(), re.M):
            _resolve(path)


# ----------------------------------------------------------------------------- generators


def test_every_marker_names_a_generator_and_expands():
    seen = set()
    for page in PAGES:
        text = page.read_text()
        for name, _arg in hooks.MARKER.findall(text):
            assert name in hooks.GENERATORS, (page, name)
            seen.add(name)
        out = hooks.expand(text, _page_id(page))
        assert "<!-- gen:" not in out
    assert {"collectives", "casts", "binary", "unary", "stricter", "looser", "features",
            "version-diff"} <= seen


def test_tables_cover_the_rule_table():
    from spmdtyped import _rules

    ctx = hooks.Ctx("concepts.md")
    ops = hooks.gen_axis_ops(ctx, "collectives") + hooks.gen_axis_ops(ctx, "casts")
    for name in _rules.AXIS_OPS:
        assert f"`{hooks.op_label(name)}`" in ops
    unary = hooks.gen_unary(ctx)
    nary = hooks.gen_nary_ops(ctx)
    for name in _rules.ELEMENTWISE:
        assert f"`{name}`" in unary or f"`{name}`" in nary, name
    for code, _what, _jax in _rules.STRICTER_THAN_JAX:
        assert f"[{code}]" in hooks.gen_stricter(ctx)
    assert hooks.gen_looser(ctx).count("\n") == len(_rules.LOOSER_THAN_JAX) + 1


def test_version_differences_are_real():
    diffs = hooks.version_differences()
    assert diffs, "the JAX feature sets give identical tables?"
    for _text, outs in diffs:
        assert len({o.key() for o in outs}) > 1  # some two feature sets differ on the call


# ----------------------------------------------------------------------------- runnable blocks

RUN_BLOCK = re.compile(r"^<!-- run -->\s*\n```python[^\n]*\n(.*?)^```\s*$", re.M | re.S)
#: every ```python block of a page, with whether a `<!-- run -->` marks it
PYTHON_BLOCK = re.compile(r"^(<!-- run -->\s*\n)?```python[^\n]*\n(.*?)^```\s*$", re.M | re.S)
SNIPPET = re.compile(r'^--8<-- "([^"]+)"\s*$', re.M)


def python_blocks(page: Path) -> list[tuple[bool, str]]:
    """(is a run block, source) of each ```python block of `page`, in page order, a
    `--8<-- "file"` include replaced by the file (the one collection of the pages' code: the
    run blocks below, the stub tier's pages test `test_stubgen_pages.py`)."""
    return [(bool(run), SNIPPET.sub(lambda m: (ROOT / m.group(1)).read_text(), b))
            for run, b in PYTHON_BLOCK.findall(page.read_text())]


def run_blocks(page: Path) -> list[str]:
    text = page.read_text()
    blocks = [b for run, b in python_blocks(page) if run]
    assert len(blocks) == text.count("<!-- run -->"), f"{page}: a <!-- run --> not followed by ```python"
    return blocks


PAGES_WITH_RUN_BLOCKS = [p for p in PAGES if "<!-- run -->" in p.read_text()]


def test_pages_have_run_blocks():
    assert {_page_id(p) for p in PAGES_WITH_RUN_BLOCKS} >= {"getting-started.md", "runtime.md"}


@pytest.mark.parametrize("page", PAGES_WITH_RUN_BLOCKS, ids=_page_id)
def test_run_blocks(page, monkeypatch):
    # the page's blocks run in one module, registered as a user's module is (its classes'
    # string annotations then resolve, as `typing.get_type_hints` and dataclasses expect)
    module = types.ModuleType(f"docs_{page.stem.replace('-', '_')}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    # a file a page includes (`--8<-- "docs/_snippets/model.py"`) is importable by its name,
    # as next to the page's later files (`from model import mesh, mlp`)
    for path in SNIPPET.findall("".join(RUN_BLOCK.findall(page.read_text()))):
        snippet = types.ModuleType(Path(path).stem)
        snippet.__file__ = str(ROOT / path)
        monkeypatch.setitem(sys.modules, snippet.__name__, snippet)
        exec(compile((ROOT / path).read_text(), str(ROOT / path), "exec"), snippet.__dict__)
    for i, block in enumerate(run_blocks(page)):
        exec(compile(block, f"{_page_id(page)}[run block {i}]", "exec"), module.__dict__)


# ----------------------------------------------------------------------------- mypy


MODEL = DOCS / "_snippets" / "model.py"
MYPY_VARIANTS = {
    # what getting-started.md says mypy reports, as (old, new, expected error code)
    "double_psum": ('return st.psum(partial, "tp")', 'return st.psum(st.psum(partial, "tp"), "tp")',
                    "spmd-invariant-operand"),
    "wrong_return": ('-> Varying["dp"]:', '-> Reduced["tp"]:', "spmd-out-spec-state"),
    "wrong_annotation": ('h: Varying["dp", "tp"] =', 'h: Varying["dp"] =', "assignment"),
}


def _mypy(tmp: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    cfg = tmp / "mypy.ini"
    cfg.write_text(f"[mypy]\nplugins = spmdtyped.mypy_plugin\ncache_dir = {tmp / 'cache'}\n"
                   "[mypy-spmdtyped.*]\nfollow_imports = silent\n")
    env = {**os.environ, "MYPYPATH": str(ROOT),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(cfg),
                           "--no-error-summary", *map(str, files)],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def mypy_run(tmp_path_factory):
    """One mypy run (a cold run costs ~20 s) over the model and each mistake."""
    pytest.importorskip("mypy")
    tmp = tmp_path_factory.mktemp("docs_mypy")
    source = MODEL.read_text()
    files = [tmp / "model.py"]
    files[0].write_text(source)
    for name, (old, new, _code) in MYPY_VARIANTS.items():
        assert old in source, f"docs/_snippets/model.py changed: update MYPY_VARIANTS[{name!r}]"
        files.append(tmp / f"{name}.py")
        files[-1].write_text(source.replace(old, new).replace(
            "from spmdtyped import Varying", "from spmdtyped import Reduced, Varying"))
    res = _mypy(tmp, *files)
    return res.stdout.splitlines(), res.stdout + res.stderr


def test_getting_started_model_passes_mypy(mypy_run):
    lines, output = mypy_run
    assert not [line for line in lines if line.startswith("model.py:")], output
    assert not [line for line in lines if "mypy.ini" in line], output   # the plugin loaded
    assert "Traceback" not in output, output


def test_getting_started_mistakes_fail_mypy(mypy_run):
    lines, output = mypy_run
    for name, (_old, _new, code) in MYPY_VARIANTS.items():
        errors = [line for line in lines if line.startswith(f"{name}.py:") and ": error:" in line]
        assert any(line.endswith(f"[{code}]") for line in errors), (name, output)
    # the output getting-started.md shows is the real one
    page = (DOCS / "getting-started.md").read_text()
    shown = re.search(r"```text\n(model\.py:.*?)\n```", page, re.S)
    assert shown is not None
    actual = [line.replace("double_psum.py:", "model.py:") for line in lines
              if line.startswith("double_psum.py:")]
    assert shown.group(1).splitlines() == actual, "\n".join(actual)


# ----------------------------------------------------------------------------- mkdocs build


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    pytest.importorskip("mkdocstrings_handlers.python")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    for code in _errors.REGISTRY:
        page = site / "errors" / code / "index.html"
        assert page.exists(), code
        assert _errors.REGISTRY[code].title.split("`")[0][:30] in html.unescape(page.read_text())
    reference = (site / "reference" / "index.html").read_text()
    assert "st.psum" in reference
