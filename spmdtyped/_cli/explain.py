"""`python -m spmdtyped explain [CODE]`: one error page, or the list of codes."""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str]) -> int:
    from .._errors import REGISTRY, SpmdTypeError, explain

    parser = argparse.ArgumentParser(prog="python -m spmdtyped explain")
    parser.add_argument("code", nargs="?", help="an SPMD### code (or 101, spmd-<slug>, <slug>); "
                        "omit to list all codes")
    args = parser.parse_args(argv)
    try:
        if args.code is None:
            text = "\n".join(f"{code}  {entry.mypy_code:28s} {entry.title}"
                             for code, entry in REGISTRY.items())
        else:
            text = explain(args.code)
    except SpmdTypeError as e:
        print(e, file=sys.stderr)
        return 2
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader stopped early (`explain SPMD101 | head -1`): point stdout at devnull so the
        # interpreter's final flush does not print a traceback (Python's documented recipe)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
