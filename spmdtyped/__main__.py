"""`python -m spmdtyped {demo,check,infer,port,explain,stubgen}` and `python -m spmdtyped --version`."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence

# subcommand -> (module, help); each module has `main(argv: list[str]) -> int`
_COMMANDS = {
    "demo": ("spmdtyped._demo", "a typed dp x tp model on 8 simulated CPU devices"),
    "check": ("spmdtyped._cli_check", "run mypy with the spmdtyped plugin on PATH..."),
    "infer": ("spmdtyped.adapters._cli", "infer the typed signature of a raw shard_map function"),
    "port": ("spmdtyped.adapters._codemod", "rewrite raw shard_map code to spmdtyped (libcst)"),
    "explain": ("spmdtyped.__main__", "print the page of an error code, e.g. SPMD101"),
    "report": ("spmdtyped._report.cli", "the communication report of a step (FILE[:FUNC])"),
    "stubgen": ("spmdtyped._stubgen", "write typings/spmdtyped/ for pyright / Pylance (--axes dp,tp)"),
}


#: subcommand -> (module it needs, the extra that installs it)
_NEEDS = {"check": ("mypy", "mypy"), "port": ("libcst", "port")}


def explain_main(argv: list[str]) -> int:
    from ._errors import REGISTRY, SpmdTypeError, explain

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


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("--version", "-V"):
        from . import __version__

        print(f"spmdtyped {__version__}")
        return 0
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in _COMMANDS:
        print("usage: python -m spmdtyped {" + ",".join(_COMMANDS) + "} ...\n")
        for name, (_, help_) in _COMMANDS.items():
            print(f"  {name:8s} {help_}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "explain":
        return explain_main(rest)
    if cmd in _NEEDS and importlib.util.find_spec(_NEEDS[cmd][0]) is None:
        dep, extra = _NEEDS[cmd]
        print(f"python -m spmdtyped {cmd} needs {dep}, which is not installed: "
              f"pip install 'spmdtyped[{extra}]'  (or: pip install {dep})", file=sys.stderr)
        return 2
    module = importlib.import_module(_COMMANDS[cmd][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
