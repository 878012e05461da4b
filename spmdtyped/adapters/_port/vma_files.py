"""`port --enable-vma`: where the candidates of a migration are written, and the names
`import` gives them.

Each candidate (the module migrated and the helpers given with it, after each edit) is
written into a temporary folder and imported from there. A module of a package
(`qwen3_jax/model.py`, imported as `qwen3_jax.model`: the name the original run imported it
under, namespace packages included, else the folders with an `__init__.py` around it) is
written inside a copy of its outermost package's Python files, so that `from qwen3_jax import
model` and the package's own relative imports (`from . import ragged_attention`) find the
candidate; any other module is written under its file name, next to the candidate script
that imports it by that name.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterable, Mapping


def _imported_as(path: str) -> str | None:
    """The name the file was imported under (a dotted one when it was imported as a
    package's module, namespace packages included), or None."""
    want = os.path.abspath(path)
    best = None
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and os.path.abspath(file) == want and \
                (best is None or name.count(".") > best.count(".")):
            best = name
    return best


def _package_depth(path: str) -> int:
    """How many folders above the file `path` belong to its package: from the name it was
    imported under, else from the `__init__.py` files around it (0: not in a package)."""
    name = _imported_as(path)
    if name is not None and "." in name:
        depth = name.count(".")
        if os.path.basename(path) == "__init__.py":
            depth += 1
        return depth
    folder, depth = os.path.dirname(os.path.abspath(path)), 0
    while os.path.isfile(os.path.join(folder, "__init__.py")) and \
            os.path.dirname(folder) != folder:
        folder, depth = os.path.dirname(folder), depth + 1
    return depth


def package_root(path: str) -> str | None:
    """The outermost package folder holding the file `path`, or None (not in a package)."""
    depth = _package_depth(path)
    if depth == 0:
        return None
    folder = os.path.dirname(os.path.abspath(path))
    for _ in range(depth - 1):
        folder = os.path.dirname(folder)
    return folder


def relname(path: str) -> str:
    """The file's path as its import sees it: from the parent of its outermost package
    (`qwen3_jax/model.py`), or its file name."""
    top = package_root(path)
    if top is None:
        return os.path.basename(path)
    return os.path.relpath(os.path.abspath(path), os.path.dirname(top))


def module_name(rel: str) -> str:
    """The name `import` gives the file whose `relname` is `rel` (`qwen3_jax/model.py`:
    `qwen3_jax.model`; `kernels.py`: `kernels`)."""
    stem = os.path.splitext(rel)[0]
    parts = stem.split(os.sep)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def layout(paths: Iterable[str]) -> dict[str, str]:
    """Each file's `relname`, read once: after the original run imported them, so that the
    names stay the ones that import used while the candidates are imported and forgotten."""
    return {p: relname(p) for p in paths}


def _sources_only(folder: str, names: list[str]) -> set[str]:
    return {n for n in names if not (n.endswith(".py") or os.path.isdir(os.path.join(folder, n)))
            or n == "__pycache__"}


def write_candidates(folder: str, sources: Mapping[str, str],
                     names: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each module's text (`sources`: path -> text) written into `folder` under its `relname`
    (`names`, a `layout`; a package's module inside a copy of the package's Python files);
    path -> the file."""
    names = {**layout(p for p in sources if p not in (names or {})), **(names or {})}
    at = {p: os.path.join(folder, names[p]) for p in sources}
    if len(set(at.values())) < len(at):
        raise ValueError(f"the modules migrated together need distinct file names: "
                         f"{', '.join(sorted(sources))}")
    for p, text in sources.items():
        parts = names[p].split(os.sep)
        if len(parts) > 1:
            root = os.path.abspath(p)[:-len(names[p])]
            copy = os.path.join(folder, parts[0])
            if not os.path.isdir(copy):
                shutil.copytree(os.path.join(root, parts[0]), copy, ignore=_sources_only)
        with open(at[p], "w", encoding="utf-8") as fh:
            fh.write(text)
    return at


def imported(names: Iterable[str]) -> list[str]:
    """The entries of `sys.modules` that importing the modules `names` anew must replace: each
    module, and for a package's module every module of its outermost package (their
    `__path__` names the original folder)."""
    tops = {n.split(".")[0] for n in names if "." in n}
    out = set(names)
    out |= {k for k in sys.modules if k in tops or k.split(".")[0] in tops}
    return sorted(out)
