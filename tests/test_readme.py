"""The README's code runs and its sample message is the one the runtime prints.

The first ```` ```python ```` block of README.md (imports, the mesh, `mlp`) and the block that is
followed by a ```` ```text ```` block (the mistake) run in one namespace on 8 simulated CPU
devices; the mistake must raise an `SpmdTypeError` whose text is the text block, line for line.
After a deliberate change to the message, rewrite the block with

    PYTHONPATH=. .venv/bin/python tests/test_readme.py --write
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

_PYTHON = re.compile(r"^```python\n(.*?)^```$", re.M | re.S)
#: what may follow the mistake's block: blank lines, one line of prose, then the message block
_MESSAGE = re.compile(r"\n(?:\n(?!```)[^\n]*\n)?\n```text\n(?P<text>.*?)^```$", re.M | re.S)


def readme_mistake(text: str) -> tuple[str, str, re.Match[str]]:
    """(the first python block, the python block followed by a text block, the match of
    that text block)."""
    blocks = list(_PYTHON.finditer(text))
    assert blocks, "README.md: no ```python block"
    for block in blocks[1:]:
        m = _MESSAGE.match(text, block.end())
        if m is not None:
            return blocks[0].group(1), block.group(1), m
    raise AssertionError("README.md: no ```python block followed by its ```text message")


def raised_message(setup: str, code: str) -> str:
    import spmdtyped as st

    ns: dict[str, object] = {"__name__": "readme"}
    exec(compile(setup, "README.md (setup block)", "exec"), ns)  # noqa: S102
    try:
        exec(compile(code, "README.md (the mistake)", "exec"), ns)  # noqa: S102
    except st.SpmdTypeError as e:
        return str(e)
    raise AssertionError("README.md: the mistake raised no SpmdTypeError")


def test_readme_message_is_the_runtime_message() -> None:
    setup, code, m = readme_mistake(README.read_text())
    shown = m.group("text").rstrip("\n")
    actual = raised_message(setup, code)
    assert shown == actual, (
        "README.md's sample message is not what the runtime prints; rewrite it with "
        f"`python tests/test_readme.py --write`.\n--- README ---\n{shown}\n--- runtime ---\n{actual}")
    code_ = re.search(r"\[(SPMD\d{3})\]", actual)
    assert code_ is not None and f"errors/{code_.group(1)}/" in actual  # the page is linked


def test_readme_says_how_to_build_and_read_the_docs() -> None:
    text = README.read_text()
    assert "make docs" in text and "mkdocs serve" in text and "http.server -d site" in text
    assert "tests/README.md" in text


def main(argv: list[str]) -> int:
    if argv != ["--write"]:
        print(__doc__)
        return 2
    text = README.read_text()
    setup, code, m = readme_mistake(text)
    actual = raised_message(setup, code)
    start, end = m.span("text")
    README.write_text(text[:start] + actual + "\n" + text[end:])
    print(f"README.md: message block rewritten ({len(actual.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.exit(main(sys.argv[1:]))
