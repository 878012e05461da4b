"""`import spmdtyped` and `import spmdtyped._rules` do not import JAX (DESIGN §2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter (nothing imported yet) from the repository root."""
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("module", ["spmdtyped", "spmdtyped._rules", "spmdtyped._errors",
                                    "spmdtyped._typed.hints"])
def test_import_does_not_import_jax(module: str) -> None:
    code = (
        "import sys\n"
        f"import {module}\n"
        "bad = sorted(m for m in sys.modules if m == 'jax' or m.startswith(('jax.', 'jaxlib')))\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    out = _python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_hints_work_without_jax() -> None:
    code = (
        "import sys\n"
        "import spmdtyped as st\n"
        "h = st.Typed[st.Varying['dp'], st.Reduced['tp']]\n"
        "assert st.Varying['dp'] is st.Varying['dp']\n"
        "assert h.__name__\n"
        "assert 'jax' not in sys.modules\n"
    )
    out = _python(code)
    assert out.returncode == 0, out.stderr


def test_lazy_names_load_jax() -> None:
    code = "import sys\nimport spmdtyped as st\nst.psum\nassert 'jax' in sys.modules\n"
    out = _python(code)
    assert out.returncode == 0, out.stderr
