"""A vocabulary-parallel language-model head in equinox, as Megatron-style code writes it: the
embedding table sharded over tp on its vocabulary dim, the output projection sharded over tp
on its vocabulary dim, `jnp` / `jax.nn` / `jax.lax` inside the modules and
`eqx.filter_value_and_grad` in the step. The lookup takes `ids - axis_index * n`, masks the
ids outside the shard and sums the parts over tp; the cross-entropy takes the max and the sum
of exponentials over the whole vocabulary (`pmax`, `psum`) and the label's logit from the
shard that holds it. Two realistic mistakes run silently wrong under JAX:

- the label's logit (or the embedding row) read with the *global* id from the local shard
  (the offset forgotten): every device reads the same local positions of a different shard.
  An index replicated over tp that picks along a dim sharded over tp is SPMD215
  (`_rules.refine.indexed_along_shard`, read by the engine's gather rule and the typed
  `take`), at the lookup's line;
- `jax.nn.logsumexp` over the local shard of the vocabulary: SPMD211 at its line, the message
  naming the primitive as a step of JAX's function where the stack shows it.

The right head's loss and gradients equal one device's on every face.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import on_face
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import Varying

B, T, V, D, TP = 4, 8, 32, 8, 4
FACES = ["typed_shard_map", "checking", "st.shard_map"]


class Embedding(eqx.Module):
    weight: jax.Array                       # (V / tp, D) here: the vocabulary sharded over tp
    mistake: str = eqx.field(static=True, default="")

    def __call__(self, ids):
        n = self.weight.shape[0]
        if self.mistake == "embedding_global_ids":
            return jax.lax.psum(self.weight[ids], "tp")  # MISTAKE: embedding_global_ids
        local = ids - jax.lax.axis_index("tp") * n
        inside = (local >= 0) & (local < n)
        rows = jnp.take(self.weight, jnp.clip(local, 0, n - 1), axis=0)
        return jax.lax.psum(jnp.where(inside[..., None], rows, 0.0), "tp")


def cross_entropy(logits, labels, mistake=""):
    """Mean cross-entropy of logits whose last (vocabulary) dim is sharded over tp."""
    n = logits.shape[-1]
    if mistake == "local_logsumexp":
        lse = jax.lax.pmean(jax.nn.logsumexp(logits, axis=-1), "tp")  # MISTAKE: local_logsumexp
    else:
        m = jax.lax.pmax(jax.lax.stop_gradient(logits.max(axis=-1)), "tp")
        lse = jnp.log(jax.lax.psum(jnp.exp(logits - m[..., None]).sum(-1), "tp")) + m
    local = labels if mistake == "label_global_ids" else labels - jax.lax.axis_index("tp") * n
    inside = (local >= 0) & (local < n)
    picked = jnp.take_along_axis(logits, jnp.clip(local, 0, n - 1)[..., None], axis=-1)[..., 0]  # the label's logit
    target = jax.lax.psum(jnp.where(inside, picked, 0.0), "tp")
    return jnp.mean(lse - target)


class LM(eqx.Module):
    embed: Embedding
    head: jax.Array                         # (D, V / tp)
    mistake: str = eqx.field(static=True, default="")

    def loss(self, ids, labels):
        h = jnp.tanh(self.embed(ids))
        return cross_entropy(h @ self.head, labels, self.mistake)


def _model(mistake=""):
    k = jax.random.split(jax.random.key(7), 2)
    return LM(Embedding(jax.random.normal(k[0], (V, D)), mistake),
              jax.random.normal(k[1], (D, V)) / np.sqrt(D), mistake)


def _specs(mistake=""):
    """The model's in_specs (its static `mistake` is part of the pytree's structure)."""
    return LM(Embedding(P("tp", None), mistake), P(None, "tp"), mistake)


def _data():
    k = jax.random.split(jax.random.key(8), 2)
    return (jax.random.randint(k[0], (B, T), 0, V), jax.random.randint(k[1], (B, T), 0, V))


def _body(model, ids, labels):
    def loss_fn(m):
        return jax.lax.pmean(m.loss(ids, labels), "dp")

    return eqx.filter_value_and_grad(loss_fn)(model)


def _hinted(model: LM, ids: Varying["dp"], labels: Varying["dp"]):
    return _body(model, ids, labels)


def _run(face, mistake, mesh):
    specs = _specs(mistake)
    program = on_face(face, _body, _hinted, mesh=mesh, in_specs=(specs, P("dp"), P("dp")),
                      out_specs=(P(), specs))
    model = jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(mesh, s)),
                         _model(mistake), specs)
    ids, labels = (jax.device_put(a, NamedSharding(mesh, P("dp"))) for a in _data())
    return program(model, ids, labels)


def _reference():
    """One device: the whole table and projection, the textbook cross-entropy."""
    def loss_fn(m):
        logits = jnp.tanh(m.embed.weight[ids]) @ m.head
        picked = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
        return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)

    ids, labels = _data()
    return eqx.filter_value_and_grad(loss_fn)(_model())


def _line(marker):
    with open(__file__) as f:
        return next(n for n, text in enumerate(f, 1) if marker in text and "MISTAKE" in text
                    or text.rstrip().endswith(marker))


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, TP), ("dp", "tp"))


@pytest.mark.parametrize("face", [*FACES, "jax"])
def test_vocab_parallel_head_trains_equal_to_one_device(face, mesh):
    loss, grads = _run(face, "", mesh)
    want_loss, want = _reference()
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-5)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("mistake", ["embedding_global_ids", "label_global_ids",
                                     "local_logsumexp"])
def test_each_mistake_is_real(mistake, mesh):
    loss, _grads = _run("jax", mistake, mesh)
    assert abs(float(loss) - float(_reference()[0])) > 1e-2


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize(("mistake", "marker"), [
    ("embedding_global_ids", "embedding_global_ids"), ("label_global_ids", "# the label's logit")])
def test_global_ids_into_a_vocabulary_shard_is_spmd215(mistake, marker, face, mesh):
    with pytest.raises(st.SpmdTypeError) as e:
        _run(face, mistake, mesh)
    assert e.value.code == "SPMD215", str(e.value)
    assert "picks along dim" in e.value.headline and "axis_index('tp')" in e.value.fix
    assert (e.value.file, e.value.line) == (__file__, _line(marker)), str(e.value)
    if mistake == "label_global_ids":   # JAX's function the line called, named beside the gather
        assert "a step of JAX's take_along_axis" in str(e.value)


@pytest.mark.parametrize("face", FACES)
def test_logsumexp_over_the_local_vocabulary_is_spmd211(face, mesh):
    with pytest.raises(st.SpmdTypeError) as e:
        _run(face, "local_logsumexp", mesh)
    assert e.value.code == "SPMD211", str(e.value)
    assert (e.value.file, e.value.line) == (__file__, _line("local_logsumexp")), str(e.value)


def test_the_typed_take_along_axis_reads_the_same_rule(mesh):
    """The dialect's `st.numpy.take_along_axis` of typed values: the same rule, which the typed
    op's check and the engine's gather rule both read (either one alone raises it here)."""
    @st.shard_map(mesh=mesh, in_specs=(P("dp", None, "tp"), P("dp")), out_specs=P("dp"))
    def picked(logits: Varying["dp", "tp"], labels: Varying["dp"]):
        return st.numpy.take_along_axis(logits, labels[..., None], axis=-1)  # typed take

    logits = jax.device_put(jnp.zeros((B, T, V)), NamedSharding(mesh, P("dp", None, "tp")))
    labels = jax.device_put(_data()[1], NamedSharding(mesh, P("dp")))
    with pytest.raises(st.SpmdTypeError) as e:
        jax.jit(picked)(logits, labels)
    assert e.value.code == "SPMD215" and e.value.line == _line("# typed take"), str(e.value)


@pytest.mark.parametrize("face", ["typed_shard_map", "checking"])
def test_rows_gathered_by_an_argsort_of_local_keys_are_not_spmd215(face, mesh):
    """MoE-style dispatch: this device's tokens gathered in the order of an argsort of their
    router scores. JAX types the permutation Invariant on jax 0.10.2 (its sort rule gives the
    sorted iota the iota's type) and Varying with the iota's Rep cast on 0.12.1; either way it
    varies with the keys, so it is no replicated index (`Side.unsure`, the sort rule)."""
    def body(x, r):
        return x[jnp.argsort((x @ r)[:, 0])]

    x = jax.random.normal(jax.random.key(9), (16, D))
    r = jax.random.normal(jax.random.key(10), (D, 3))
    smap = st.adapters.typed_shard_map if face == "typed_shard_map" else jax.shard_map
    program = jax.jit(smap(body, mesh=mesh, in_specs=(P(("dp", "tp")), P()),
                           out_specs=P(("dp", "tp"))))
    if face == "checking":
        program = st.adapters.checking(program)
    put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))  # noqa: E731
    got = np.asarray(program(put(x, P(("dp", "tp"))), put(r, P())))
    want = np.concatenate([np.asarray(body(x[i:i + 2], r)) for i in range(0, 16, 2)])
    np.testing.assert_allclose(got, want, rtol=1e-6)


def _eqx_embedding_step(embedding, ids):
    """equinox's own `eqx.nn.Embedding` on a table sharded over tp by its vocabulary, called
    with the global ids as its docs call it, the rows summed over tp."""
    def loss(e):
        h = jax.lax.psum(jax.vmap(e)(ids), "tp")  # eqx.nn.Embedding with global ids
        return jax.lax.pmean(jnp.mean(h ** 2), "dp")

    return eqx.filter_value_and_grad(loss)(embedding)


@pytest.mark.parametrize("face", ["typed_shard_map", "checking"])
def test_eqx_embedding_fed_global_ids_is_spmd215_at_the_users_call(face, mesh):
    """JAX clamps the ids past the shard (indexing's default), so raw JAX runs silently wrong
    against one device; spmdtyped names the user's call of the layer, equinox's line beside."""
    embedding = eqx.nn.Embedding(V, D, key=jax.random.key(3))
    specs = jax.tree.map(lambda _: P("tp", None), embedding)
    ids = _data()[0][:, 0]
    put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))  # noqa: E731
    args = (jax.tree.map(put, embedding, specs), put(ids, P("dp")))
    io = dict(mesh=mesh, in_specs=(specs, P("dp")), out_specs=(P(), specs))
    raw, _ = on_face("jax", _eqx_embedding_step, _eqx_embedding_step, **io)(*args)
    want = jnp.mean(jax.vmap(embedding)(ids) ** 2)
    assert not np.isnan(float(raw)) and abs(float(raw) - float(want)) > 1e-2
    with pytest.raises(st.SpmdTypeError) as e:
        on_face(face, _eqx_embedding_step, _eqx_embedding_step, **io)(*args)
    assert e.value.code == "SPMD215", str(e.value)
    assert (e.value.file, e.value.line) == (__file__, _line("# eqx.nn.Embedding with global ids"))
    assert "equinox" in str(e.value) and "inside an installed package" in str(e.value)
