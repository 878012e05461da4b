"""`python -m spmdtyped stubgen --axes dp,tp`: write the pyright / Pylance stub."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import _rules
from .._errors import SpmdTypeError
from .._stubgen import messages, parse_axes, write


def main(argv: list[str]) -> int:

    parser = argparse.ArgumentParser(prog="python -m spmdtyped stubgen",
                                     description="write typings/spmdtyped/ for pyright, Pylance "
                                                 "and plain mypy (docs/pyright.md)")
    parser.add_argument("--axes", required=True, help="the mesh axis names, e.g. dp,tp")
    parser.add_argument("--out", default="typings", help="the stub folder (default: typings)")
    parser.add_argument("--jax", choices=("0.10", "0.12"), default=None,
                        help="the JAX version's rules (default: what every supported JAX allows)")
    parser.add_argument("--messages", action="store_true",
                        help="also print every @deprecated message of the stub")
    args = parser.parse_args(argv)
    try:
        axes = parse_axes(args.axes)
    except SpmdTypeError as e:
        print(f"error: {e.headline} [{e.code}]\n  fix: {e.fix}", file=sys.stderr)
        return 2
    features = {"0.10": _rules.JAX_0_10, "0.12": _rules.JAX_0_12}.get(args.jax or "",
                                                                      _rules.CONSERVATIVE)
    paths = write(axes, Path(args.out), features)
    lines = sum(p.read_text().count("\n") for p in paths)
    print(f"wrote {len(paths)} files ({lines} lines) under {args.out}/spmdtyped for axes "
          f"{', '.join(axes)}")
    if args.messages:
        print("\n".join(messages(axes, features)))
    return 0
