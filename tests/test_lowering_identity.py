"""Every example's typed program lowers to exactly the StableHLO of its hand-written raw twin
(locations, debug names, the module name and function symbols normalised away): spmdtyped adds
nothing to the compiled program. The timing side of this lives in `benchmarks/` (`make bench`);
nothing here is timed."""

import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import example_names  # noqa: E402
from benchmarks.lowering import compare_example, normalize  # noqa: E402


@pytest.mark.parametrize("name", example_names())
def test_typed_lowers_to_the_raw_program(name):
    module = importlib.import_module(f"examples.{name}")
    identical, diff = compare_example(module)
    assert identical, f"examples/{name}.py: typed and raw StableHLO differ:\n{diff}"


def test_normalize_only_renames():
    a = ('module @jit_step attributes {x} {\n  func.func public @main(%a) {\n'
         '    %0 = call @_where(%a)\n  }\n  func.func private @_where(%b) {}\n}')
    b = a.replace("@jit_step", "@jit_step_raw").replace("@_where", "@_where_0")
    assert normalize(a) == normalize(b)
    assert "@f1(%a)" in normalize(a)
    assert normalize(a) != normalize(a.replace("%0 = call", "%0 = stablehlo.add"))


def test_source_locations_name_the_users_code():
    """With debug info, the typed program's locations point at the user's lines, as the raw
    program's do, never into spmdtyped (its frames are excluded like JAX's own)."""
    import re

    import spmdtyped

    module = importlib.import_module("examples.megatron_mlp")
    mesh = module.make_mesh()
    typed, raw = module.programs(mesh)
    text = typed.lower(*module.make_inputs(mesh)).as_text(debug_info=True)
    files = set(re.findall(r'"([^"]+\.py)":\d+', text))
    package = str(Path(spmdtyped.__file__).resolve().parent)
    assert any(f.endswith("megatron_mlp.py") for f in files), files
    assert not [f for f in files if str(Path(f).resolve()).startswith(package)], files
