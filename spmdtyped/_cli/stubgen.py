"""`python -m spmdtyped stubgen --axes dp,tp`: write the pyright / Pylance stub."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import _rules
from .._errors import SpmdTypeError
from .._stubgen import messages, parse_axes, vocabulary, write


def main(argv: list[str]) -> int:

    parser = argparse.ArgumentParser(prog="python -m spmdtyped stubgen",
                                     description="write typings/spmdtyped/ for pyright, Pylance "
                                                 "and plain mypy (docs/pyright.md)")
    parser.add_argument("--axes", required=True, help="the mesh axis names, e.g. dp,tp")
    parser.add_argument("--out", default="typings", help="the stub folder (default: typings)")
    parser.add_argument("--jax", choices=("0.10", "0.12"), default=None,
                        help="the JAX version's rules (default: what every supported JAX allows)")
    parser.add_argument("--vocab", default=None, metavar="FILE",
                        help="also write the axis vocabulary module FILE (e.g. axes.py): "
                             "`from axes import dp, tp` in each module instead of declaring "
                             "`dp: TypeAlias = Literal['dp']` there")
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
    if args.vocab:
        vocab = Path(args.vocab)
        vocab.parent.mkdir(parents=True, exist_ok=True)
        vocab.write_text(vocabulary(axes, vocab.stem))
        print(f"wrote the axis vocabulary {vocab} (`from {vocab.stem} import {', '.join(axes)}`)")
    print(f"note: run pyright with this environment's interpreter (`pyright --pythonpath "
          f"{sys.executable}`, or `venvPath` / `venv` in pyrightconfig.json; Pylance: select it "
          f"as the interpreter); without it jax.Array is Unknown to pyright, which then warns "
          f"'Import \"spmdtyped\" could not be resolved from source' (reportMissingModuleSource) "
          f"and types raw JAX values as Unknown")
    if args.messages:
        print("\n".join(messages(axes, features)))
    return 0
