"""`adapters._patching.Patch`: the one helper behind `checked_lax` and `routed_autodiff`."""

import threading
import types

import jax
import pytest

import spmdtyped as st
from spmdtyped._engine import patching as _patching
from spmdtyped._engine import refine_route as _refine_route


def _module():
    m = types.ModuleType("patched")
    m.f, m.g = (lambda: "orig"), (lambda: "g")
    return m


def test_patch_nests_and_restores_on_the_outermost_exit():
    m = _module()
    orig = m.f
    seen = []

    def replacements(originals):
        seen.append(originals[(m, "f")])
        return {(m, "f"): lambda: "new"}

    patch = _patching.Patch(((m, "f"),), replacements)
    with patch.active():
        assert m.f() == "new"
        with patch.active():
            assert m.f() == "new"
        assert m.f() == "new"  # the inner exit keeps the outer block's patch
    assert m.f is orig and m.g() == "g"
    assert seen == [orig]  # replacements made once per outermost entry, from the originals


def test_patch_restores_after_an_exception():
    m = _module()
    orig = m.f
    patch = _patching.Patch(((m, "f"),), lambda o: {(m, "f"): lambda: "new"})
    with pytest.raises(ZeroDivisionError), patch.active():
        assert m.f() == "new"
        _ = 1 / 0
    assert m.f is orig
    with patch.active():  # usable again
        assert m.f() == "new"
    assert m.f is orig


def test_patch_is_thread_safe():
    m = _module()
    orig = m.f
    patch = _patching.Patch(((m, "f"),), lambda o: {(m, "f"): lambda: "new"})
    start, errors = threading.Barrier(8), []

    def work():
        start.wait()
        for _ in range(200):
            with patch.active():
                if m.f() != "new":
                    errors.append("unpatched inside a block")

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and m.f is orig


def test_both_routes_compose_and_restore():
    lax_psum, grad, vjp = jax.lax.psum, jax.grad, jax.vjp
    with st.adapters.checked_lax(), _refine_route.routed_autodiff():
        assert jax.lax.psum is st.lax.psum
        assert jax.grad is not grad and jax.vjp is not vjp
        with _refine_route.routed_autodiff():
            assert jax.grad is not grad
    assert (jax.lax.psum, jax.grad, jax.vjp) == (lax_psum, grad, vjp)
