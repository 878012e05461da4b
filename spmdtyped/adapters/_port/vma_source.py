"""The source text `port --enable-vma` edits (`vma`): positions of `ast` nodes in it, a node's
text replaced, how a module names `jax.lax` and the functions it calls, and the states of a
Pallas kernel's outputs written into its `ShapeDtypeStruct`s."""

from __future__ import annotations

import ast
from collections.abc import Callable


def offsets(source: str) -> list[int]:
    """The offset of each line's first character in `source`, and its length last."""
    starts, pos = [], 0
    for line in source.splitlines(keepends=True):
        starts.append(pos)
        pos += len(line)
    starts.append(pos)
    return starts


def _pos(source: str, starts: list[int], line: int, col: int) -> int:
    # ast columns are UTF-8 byte offsets into the line
    text = source[starts[line - 1]:starts[line]]
    return starts[line - 1] + len(text.encode("utf-8")[:col].decode("utf-8"))


def _span(source: str, node: ast.AST) -> tuple[int, int]:
    starts = offsets(source)
    return (_pos(source, starts, node.lineno, node.col_offset),  # type: ignore[attr-defined]
            _pos(source, starts, node.end_lineno, node.end_col_offset))  # type: ignore[attr-defined]


def replace(source: str, node: ast.AST, make: Callable[[str], str]) -> str:
    return edited(source, node, make)[0]


def edited(source: str, node: ast.AST, make: Callable[[str], str]
            ) -> tuple[str, tuple[str, str]]:
    """`source` with the text of `node` replaced by `make(text)`, and (that text, its
    replacement)."""
    a, b = _span(source, node)
    text = source[a:b]
    made = make(text)
    return source[:a] + made + source[b:], (text, made)


def lax_name(source: str) -> str:
    """How the module names `jax.lax` (`jax.lax`, `lax`, an alias)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom) and node.module == "jax" and not node.level:
            for a in node.names:
                if a.name == "lax":
                    return a.asname or "lax"
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "jax.lax" and a.asname:
                    return a.asname
                if a.name == "jax":
                    return f"{a.asname or 'jax'}.lax"
    return "jax.lax"


def expr_name(node: ast.expr) -> str | None:
    """The last name of `jax.lax.scan` / `scan` (an attribute or a name); None otherwise."""
    return node.attr if isinstance(node, ast.Attribute) else \
        node.id if isinstance(node, ast.Name) else None


def func_name(call: ast.Call) -> str | None:
    return expr_name(call.func)


def partial_of(call: ast.Call) -> str | None:
    """The function `partial(f, ...)` binds, by `expr_name`; None for any other call."""
    return expr_name(call.args[0]) if func_name(call) == "partial" and call.args else None


def is_shard_map_call(call: ast.Call) -> bool:
    # jax.shard_map(...), partial(jax.shard_map, ...)
    return "shard_map" in (func_name(call), partial_of(call))


def with_output_states(source: str, scope: ast.AST, axes: tuple[str, ...]) -> tuple[str, int, str]:
    """Every `jax.ShapeDtypeStruct(...)` (and `partial(jax.ShapeDtypeStruct, ...)`) of `scope`
    (the function that makes a `pallas_call`) without a `manual_axis_type=`, given one:
    Varying over `axes`, as JAX's own tests of Pallas under shard_map spell it. A kernel's
    out_shape is often built over several statements (a list, `+=`, a partial for the
    scratch buffers), so the function's are all edited; the keyword goes after the last
    argument, so the line count stays the module's. Returns the new source, how many were
    edited and the keyword as written."""
    found = []
    for node in ast.walk(scope):
        if not isinstance(node, ast.Call) or any(k.arg == "manual_axis_type"
                                                 for k in node.keywords):
            continue
        target = node.args[0] if partial_of(node) is not None else node.func
        arguments = [*node.args, *(k.value for k in node.keywords)]
        if expr_name(target) == "ShapeDtypeStruct" and arguments:
            jax_name = ast.get_source_segment(source, target.value) \
                if isinstance(target, ast.Attribute) else "jax"
            found.append((max(arguments, key=lambda a: (a.end_lineno, a.end_col_offset)),
                          jax_name))
    varying = "{" + ", ".join(repr(a) for a in axes) + "}"
    for last, jax_name in sorted(found, key=lambda f: (f[0].end_lineno, f[0].end_col_offset),
                                 reverse=True):
        state = f", manual_axis_type={jax_name}.sharding.ManualAxisType(varying={varying})"

        def append(text: str, state: str = state) -> str:
            return text + state

        source = replace(source, last, append)
    return source, len(found), f"manual_axis_type=jax.sharding.ManualAxisType(varying={varying})"
