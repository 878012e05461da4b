"""`python -m spmdtyped {demo,check,infer,port,explain,stubgen}`."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# subcommand -> (module, help); each module has `main(argv: list[str]) -> int`
_COMMANDS = {
    "demo": ("spmdtyped._demo", "a typed dp x tp model on 8 simulated CPU devices"),
    "check": ("spmdtyped._cli_check", "run mypy with the spmdtyped plugin on PATH..."),
    "infer": ("spmdtyped.adapters._cli", "infer the typed signature of a raw shard_map function"),
    "port": ("spmdtyped.adapters._codemod", "rewrite raw shard_map code to spmdtyped (libcst)"),
    "explain": ("spmdtyped.__main__", "print the page of an error code, e.g. SPMD101"),
    "stubgen": ("spmdtyped._stubgen", "write typings/spmdtyped/ for pyright / Pylance (--axes dp,tp)"),
}


def explain_main(argv: list[str]) -> int:
    from ._errors import REGISTRY, explain

    parser = argparse.ArgumentParser(prog="python -m spmdtyped explain")
    parser.add_argument("code", nargs="?", help="an SPMD### code; omit to list all codes")
    args = parser.parse_args(argv)
    if args.code is None:
        for code, entry in REGISTRY.items():
            print(f"{code}  {entry.mypy_code:28s} {entry.title}")
        return 0
    try:
        print(explain(args.code))
    except KeyError as e:
        print(e.args[0], file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in _COMMANDS:
        print("usage: python -m spmdtyped {" + ",".join(_COMMANDS) + "} ...\n")
        for name, (_, help_) in _COMMANDS.items():
            print(f"  {name:8s} {help_}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "explain":
        return explain_main(rest)
    module = importlib.import_module(_COMMANDS[cmd][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
