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


def relname(path: str) -> str:
    """The file's path as its import sees it: from the parent of its outermost package
    (`qwen3_jax/model.py`), or its file name."""
    parts = os.path.abspath(path).split(os.sep)
    return os.path.join(*parts[-(_package_depth(path) + 1):])


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


def _not_sources(folder: str, names: list[str]) -> set[str]:
    """What `shutil.copytree` leaves out of a package's copy: all but its Python files and
    folders, and `__pycache__`."""
    return {n for n in names if n == "__pycache__"
            or not (n.endswith(".py") or os.path.isdir(os.path.join(folder, n)))}


def write_candidates(folder: str, sources: Mapping[str, str],
                     names: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each module's text (`sources`: path -> text) written into `folder` under its `relname`
    (`names`, a `layout`, where it has one; a package's module inside a copy of the
    package's Python files); path -> the file."""
    rel = {p: (names or {}).get(p) or relname(p) for p in sources}
    at = {p: os.path.join(folder, rel[p]) for p in sources}
    if len(set(at.values())) < len(at):
        raise ValueError(f"the modules migrated together need distinct file names: "
                         f"{', '.join(sorted(sources))}")
    for p, text in sources.items():
        top = rel[p].split(os.sep)[0]
        if top != rel[p] and not os.path.isdir(os.path.join(folder, top)):
            root = os.path.abspath(p)[:-len(rel[p])]
            shutil.copytree(os.path.join(root, top), os.path.join(folder, top),
                            ignore=_not_sources)
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
