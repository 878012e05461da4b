"""The version-dependent rules (`spmdtyped._rules.features`): every `Feature` the rule tables
name is a documented flag of `Features`, `Features.has` reads that flag, and `_compat` picks the
installed JAX's set."""

from __future__ import annotations

import dataclasses

import jax
import pytest

from spmdtyped import _compat
from spmdtyped._rules import features as F

SETS = [F.JAX_0_10, F.JAX_0_12, F.JAX_0_12_1, F.CONSERVATIVE]
FLAGS = [f for f in dataclasses.fields(F.Features) if f.name != "name"]


def test_each_feature_is_one_documented_flag() -> None:
    assert sorted(f.value for f in F.Feature) == sorted(f.name for f in FLAGS)
    for f in FLAGS:
        assert f.default is False and f.metadata["doc"].strip(), f.name


@pytest.mark.parametrize("features", SETS, ids=lambda s: s.name)
def test_has_reads_the_flag(features: F.Features) -> None:
    assert features.has(None)
    for flag in F.Feature:
        assert features.has(flag) is getattr(features, flag.value)
    # a set that turns one flag on answers for that flag alone
    for flag in F.Feature:
        one = dataclasses.replace(F.JAX_0_10, **{flag.value: True})
        assert [g for g in F.Feature if one.has(g) and not F.JAX_0_10.has(g)] == [flag]


def test_compat_picks_the_installed_jax() -> None:
    v = _compat.JAX_VERSION
    want = F.JAX_0_12_1 if v >= (0, 12, 1) else F.JAX_0_12 if v >= (0, 11) else F.JAX_0_10
    assert _compat.FEATURES is want, (jax.__version__, _compat.FEATURES.name)


def test_each_version_keeps_the_last_ones_flags() -> None:
    """jax 0.12.1 adds to 0.12's differences, 0.12 to 0.10's (none is taken back so far)."""
    for old, new in zip(SETS[:2], SETS[1:3], strict=True):
        assert all(new.has(f) for f in F.Feature if old.has(f)), (old.name, new.name)
