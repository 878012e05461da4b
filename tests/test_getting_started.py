"""First contact (issue 14, item 7): the getting-started page is self-contained (install from a
clone with the README's commands, `XLA_FLAGS` set in the example file before JAX is imported,
every code block with its own imports), and the README's links work on a package index page
(absolute https URLs to pages of the docs site that exist).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from spmdtyped import _errors

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGE = DOCS / "getting-started.md"
README = ROOT / "README.md"
SITE = "https://spmdtyped.readthedocs.io/en/latest/"

_BLOCK = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```\s*$", re.M | re.S)
_SNIPPET = re.compile(r'^--8<-- "([^"]+)"\s*$', re.M)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)|<(https?://[^>\s]+)>")


def _blocks(text: str, lang: str) -> list[str]:
    return [_SNIPPET.sub(lambda m: (ROOT / m.group(1)).read_text(), body)
            for kind, body in _BLOCK.findall(text) if kind == lang]


def _python_blocks() -> list[ast.Module]:
    out = []
    for body in _blocks(PAGE.read_text(), "python"):
        try:
            out.append(ast.parse(body))
        except SyntaxError:   # a one-line edit shown indented (`    return st.psum(...)`)
            continue
    return out


def _imported(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names |= {a.asname or a.name for a in node.names}
    return names


def _used(tree: ast.Module) -> set[str]:
    """The names a block reads and does not define itself."""
    bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    bound |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    return {n.id for n in ast.walk(tree)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - bound


def test_every_code_block_imports_what_it_uses():
    blocks = _python_blocks()
    assert len(blocks) >= 5
    page_imports = set().union(*(_imported(b) for b in blocks))
    for i, tree in enumerate(blocks):
        missing = sorted((_used(tree) & page_imports) - _imported(tree))
        assert not missing, f"python block {i} of getting-started.md uses {missing} without importing them"


def test_the_example_file_sets_xla_flags_before_importing_jax():
    model = next(b for b in _python_blocks() if "make_mesh" in ast.unparse(b))
    first_jax = min(n.lineno for n in ast.walk(model) if isinstance(n, (ast.Import, ast.ImportFrom))
                    and "jax" in ast.unparse(n).split()[1])
    sets = [n.lineno for n in ast.walk(model) if isinstance(n, ast.Assign)
            and "XLA_FLAGS" in ast.unparse(n) and "xla_force_host_platform_device_count=8" in ast.unparse(n)]
    assert sets and sets[0] < first_jax
    # the script that uses it imports it before JAX, so the flags are set first there too
    main = next(b for b in _python_blocks() if "from model import" in ast.unparse(b))
    assert isinstance(main.body[0], ast.ImportFrom) and main.body[0].module == "model"


def test_install_is_from_a_clone_with_the_readme_commands():
    shell = "\n".join(_blocks(PAGE.read_text(), "bash"))
    readme_shell = "\n".join(_blocks(README.read_text(), "bash"))
    assert "git clone" in shell
    for command in ("make test", "make demo", "pip install -e .", "pip install -e '.[mypy]'"):
        assert command in shell, command
        assert command in readme_shell, command
    assert "pip install spmdtyped " not in shell + readme_shell   # no release exists yet


def _site_page_exists(url: str) -> bool:
    path = url.removeprefix(SITE).split("#")[0].strip("/")
    if path in ("", "errors"):
        return True
    if path.startswith("errors/"):
        return path.removeprefix("errors/") in _errors.REGISTRY
    return (DOCS / f"{path}.md").exists() or (DOCS / path / "index.md").exists()


def test_readme_links_are_absolute_and_reach_docs_pages():
    text = README.read_text()
    links = [a or b for a, b in _LINK.findall(text)]
    assert len(links) >= 5
    for url in links:
        assert url.startswith("https://"), f"a relative link breaks on a package index page: {url}"
        if url.startswith(SITE):
            assert _site_page_exists(url), url
    # paths outside the repository, or to docs sources, are not links a package page can follow
    assert "../shared" not in text
    assert not re.search(r"`docs/[\w/-]+\.md`", text)


def test_the_readme_links_the_docs_site_of_the_metadata_and_the_messages():
    import tomllib

    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    assert urls["Documentation"] == SITE and _errors.DOCS_URL == SITE + "errors/"
