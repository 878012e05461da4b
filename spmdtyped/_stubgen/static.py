"""The stub's public signatures, rendered from the static view (`spmdtyped/_static.py`).

`_static.py` is what mypy (and pyright without a generated stub) reads; the stub for one axis
vocabulary declares the same functions with the same parameters, so the two cannot drift. A
declaration is copied from `_static.py`'s syntax tree (its overloads, or the function when it
has none; no body, no docstring) with the stub's spellings (`STUB_SPELLING`):

- the static view's `_V` is the stub's `_V1` (the stub's `_V` is `SArray`'s own covariant
  parameter, which a free function's signature does not use);
- a result `SArray[Any, Any, Any]` is `_Untyped`, the stub's value of unknown state (see
  `ANY_ARRAY` in `_stubgen/__init__`: every form takes it in a first, non-deprecated overload).

The TypeVars and ParamSpecs those declarations use are copied from `_static.py` too, unless
the stub defines them itself (`STUB_OWN`). `tests/test_stub_signatures.py` compares both
files' declarations, and the runtime's signatures, name by name.

Imports neither JAX nor mypy.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Sequence
from pathlib import Path

STATIC = Path(__file__).resolve().parent.parent / "_static.py"

#: the public functions whose stub declarations are `_static.py`'s, in stub order (the
#: collectives and `axis_index` are generated per axis from the rule table; names the stub does
#: not declare reach its `__getattr__`, untyped in this tier)
FUNCTIONS: tuple[str, ...] = (
    "explain", "allow", "typeof", "wrap", "unwrap", "set_check_mode", "check_mode", "axis_size",
    "shard_map", "fori_loop", "while_loop", "scan", "value_and_grad", "grad",
)
#: a name of the static view -> the stub's spelling of it
STUB_SPELLING: dict[str, str] = {"_V": "_V1"}
#: the result the stub spells `_Untyped`
UNTYPED_RESULT = "SArray[Any, Any, Any]"
#: TypeVars the stub defines itself (its header, or `model.typevars`)
STUB_OWN = frozenset({"_V", "_V1", "_U", "_R", "_A", "_F", "_TU", "_UC", "_RC"})


def parse() -> ast.Module:
    return ast.parse(STATIC.read_text(), str(STATIC))


def _is_overload(node: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "overload" for d in node.decorator_list)


def declarations(tree: ast.Module) -> dict[str, list[ast.FunctionDef]]:
    """Each top-level function of a module: its overloads, or its one definition when it has
    none (an overloaded function's implementation is left out, as a stub has none)."""
    defs: dict[str, list[ast.FunctionDef]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            defs.setdefault(node.name, []).append(node)
    return {n: ([d for d in ds if _is_overload(d)] or ds) for n, ds in defs.items()}


class _Spelling(ast.NodeTransformer):
    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.Name(STUB_SPELLING.get(node.id, node.id), node.ctx)


def stub_form(node: ast.FunctionDef) -> ast.FunctionDef:
    """`node` as the stub declares it: body `...`, the stub's spellings."""
    untyped = node.returns is not None and ast.unparse(node.returns) == UNTYPED_RESULT
    new = _Spelling().visit(copy.deepcopy(node))
    new.body = [ast.Expr(ast.Constant(...))]
    new.decorator_list = [d for d in new.decorator_list if isinstance(d, ast.Name) and d.id == "overload"]
    if untyped:
        new.returns = ast.Name("_Untyped", ast.Load())
    return ast.fix_missing_locations(new)


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _definitions(tree: ast.Module) -> dict[str, ast.stmt]:
    """The module-level TypeVars, ParamSpecs and type aliases of a module, by name."""
    out: dict[str, ast.stmt] = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name)
                and node.value.func.id in ("TypeVar", "ParamSpec")):
            out[node.targets[0].id] = node
        elif (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
              and ast.unparse(node.annotation) == "TypeAlias"):
            out[node.target.id] = node
    return out


def _text(node: ast.stmt) -> str:
    return ast.unparse(node).replace(":\n    ...", ": ...")


def lines(names: Sequence[str] = FUNCTIONS) -> list[str]:
    """The stub's declarations of `names` (and the TypeVars and aliases they use), rendered
    from `_static.py`."""
    tree = parse()
    decls = declarations(tree)
    missing = [n for n in names if n not in decls]
    if missing:  # pragma: no cover - a name dropped from _static.py
        raise ValueError(f"stubgen: _static.py declares no {missing}")
    rendered = [stub_form(d) for n in names for d in decls[n]]
    used = set().union(*(_names(d) for d in rendered))
    defs = _definitions(tree)
    return ([_text(defs[n]) for n in sorted(used & defs.keys() - STUB_OWN)]
            + [_text(d) for d in rendered])


def error_classes() -> list[str]:
    """The error hierarchy as the stub declares it, read from the runtime classes (`_errors`,
    which mypy reads too): `SpmdTypeError`'s public attributes, one subclass per category."""
    from .. import _errors

    root = _errors.SpmdTypeError
    out = [f"class {root.__name__}({root.__bases__[0].__name__}):"]
    out += [f"    {n}: {t}" for n, t in root.__annotations__.items() if not n.startswith("_")]
    out += [f"class {c.__name__}({root.__name__}): ..." for c in dict.fromkeys(_errors.CATEGORIES.values())]
    return out
