# Copyright 2024 The Flax Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

# spmdtyped: an excerpt of flax's tests/nnx/transforms_test.py at 18f8f311c275d57f46d95e41b15aa97b454754c0
# (2026-07-02): its lines 1-32 (imports) and 1305-1736 (class TestShardMap), unchanged.

import os
os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=4'

import dataclasses
from functools import partial
import typing as tp

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
from flax.nnx.transforms import general
import jax
from jax.experimental import checkify, mesh_utils
import jax.numpy as jnp
import numpy as np
import optax



class TestShardMap(parameterized.TestCase):
  def test_basic_shardmap(self):
    n_devices = jax.local_device_count()
    devices = mesh_utils.create_device_mesh((n_devices,))
    mesh = jax.sharding.Mesh(devices, ('a',))
    PS = jax.sharding.PartitionSpec

    state_sharding = nnx.StateSharding(
      {
        nnx.PathContains('kernel'): PS(None, 'a'),
        nnx.PathContains('bias'): PS(),
      }
    )

    m = nnx.Linear(16, 32, rngs=nnx.Rngs(0))

    self.assertNotIsInstance(m.kernel.sharding, jax.sharding.NamedSharding)

    @nnx.shard_map(
        mesh=mesh,
        in_specs=(state_sharding,),
        out_specs=None,
        graph=True,
        graph_updates=True,
    )
    def f(m: nnx.Linear):
      self.assertEqual(
        m.kernel.shape, (m.in_features, m.out_features // n_devices)
      )
      self.assertEqual(m.bias.shape, (m.out_features,))

    f(m)

    self.assertIsInstance(m.kernel.sharding, jax.sharding.NamedSharding)

  @parameterized.parameters(True, False)
  def test_basic_shardmap_functional(self, graph):
    n_devices = jax.local_device_count()
    devices = mesh_utils.create_device_mesh((n_devices,))
    mesh = jax.sharding.Mesh(devices, ('a',))
    PS = jax.sharding.PartitionSpec

    m = nnx.Linear(16, 32, rngs=nnx.Rngs(0))
    state_sharding = nnx.prefix(
        m,
        {
            nnx.PathContains('kernel'): PS(None, 'a'),
            nnx.PathContains('bias'): PS(),
        },
        graph=graph,
    )

    @nnx.shard_map(
        mesh=mesh,
        in_specs=(state_sharding,),
        out_specs=None,
        graph=graph,
        graph_updates=False,
    )
    def f(m: nnx.Linear):
      self.assertEqual(
          m.kernel.shape, (m.in_features, m.out_features // n_devices)
      )
      self.assertEqual(m.bias.shape, (m.out_features,))

    f(m)

  @parameterized.parameters(
    (True, True), (True, False), (False, False),
  )
  def test_basic_shardmap_variables(self, graph, graph_updates):
    n_devices = jax.local_device_count()
    devices = mesh_utils.create_device_mesh((n_devices,))
    mesh = jax.sharding.Mesh(devices, ('a',))
    P = jax.sharding.PartitionSpec

    rngs = nnx.Rngs(0)
    w = nnx.Param(jax.random.normal(rngs.params(), (16, 32)))
    b = nnx.Param(jax.random.normal(rngs.params(), (32,)))
    count = nnx.BatchStat(jnp.array(0))

    self.assertNotIsInstance(w.sharding, jax.sharding.NamedSharding)

    @nnx.shard_map(
      mesh=mesh, in_specs=(P(None, 'a'), P(), P()), out_specs=None,
      graph=graph, graph_updates=graph_updates,
    )
    def f(w, b, count):
      count[...] += 1
      self.assertEqual(w.shape, (16, 32 // n_devices))
      self.assertEqual(b.shape, (32,))

    f(w, b, count)

    if graph and graph_updates:
      self.assertIsInstance(w.sharding, jax.sharding.NamedSharding)
      self.assertIsInstance(b.sharding, jax.sharding.NamedSharding)
    self.assertEqual(count[...], 1)

  def test_from_state(self):
    n_devices = jax.local_device_count()
    devices = mesh_utils.create_device_mesh((n_devices,))
    mesh = jax.sharding.Mesh(devices, ('a',))
    PS = jax.sharding.PartitionSpec

    state_spec = nnx.State(
      {
        'kernel': PS(None, 'a'),
        'bias': PS(),
      }
    )
    state_sharding = nnx.StateSharding(state_spec)

    m = nnx.Linear(16, 32, rngs=nnx.Rngs(0))

    self.assertNotIsInstance(m.kernel.sharding, jax.sharding.NamedSharding)

    @nnx.shard_map(
        mesh=mesh,
        in_specs=(state_sharding,),
        out_specs=None,
        graph=True,
        graph_updates=True,
    )

    def f(m: nnx.Linear):
      self.assertEqual(
        m.kernel.shape, (m.in_features, m.out_features // n_devices)
      )
      self.assertEqual(m.bias.shape, (m.out_features,))

    f(m)

    self.assertIsInstance(m.kernel.sharding, jax.sharding.NamedSharding)
    self.assertIsInstance(m.bias.sharding, jax.sharding.NamedSharding)

  @parameterized.parameters(True, False)
  def test_from_state_functional(self, graph):
    n_devices = jax.local_device_count()
    devices = mesh_utils.create_device_mesh((n_devices,))
    mesh = jax.sharding.Mesh(devices, ('a',))
    PS = jax.sharding.PartitionSpec

    state_spec = nnx.State({
        'kernel': PS(None, 'a'),
        'bias': PS(),
    })

    m = nnx.Linear(16, 32, rngs=nnx.Rngs(0))
    graphdef, s = nnx.split(m)

    @nnx.shard_map(
        mesh=mesh,
        in_specs=(state_spec,),
        out_specs=None,
        graph=graph,
        graph_updates=False,
    )
    def f(s):
      m = nnx.merge(graphdef, s)
      self.assertEqual(
          m.kernel.shape, (m.in_features, m.out_features // n_devices)
      )
      self.assertEqual(m.bias.shape, (m.out_features,))

    f(s)

  @parameterized.parameters(
    (True, True), (True, False), (False, False),
  )
  def test_simple_data_parallel(self, graph, graph_updates):
    P = jax.sharding.PartitionSpec
    n_devices = jax.local_device_count()

    mesh = jax.sharding.Mesh(jax.local_devices(), ('data',))

    with jax.set_mesh(mesh):
      m = nnx.Linear(
          in_features=2,
          out_features=3,
          kernel_metadata={'out_sharding': jax.P(None)},
          bias_metadata={'out_sharding': jax.P(None)},
          rngs=nnx.Rngs(0),
    )
    x = jnp.ones((32, 2))

    @nnx.shard_map(
      mesh=mesh, in_specs=(P(None), P('data')), out_specs=P('data'),
      graph=graph, graph_updates=graph_updates,
    )
    def f(m, x):
      self.assertEqual(x.shape, (32 // n_devices, 2))
      return m(x)

    y = f(m, x)

    self.assertEqual(y.shape, (32, 3))
    self.assertIsInstance(y.sharding, jax.sharding.NamedSharding)
    if graph and graph_updates:
      self.assertIsInstance(m.kernel.sharding, jax.sharding.NamedSharding)
      self.assertIsInstance(m.bias.sharding, jax.sharding.NamedSharding)

  def test_simple_tensor_parallel(self):
    n_devices = jax.local_device_count()
    P = jax.sharding.PartitionSpec

    mesh = jax.sharding.Mesh(jax.local_devices(), ('model',))

    class MLP(nnx.Module):
      def __init__(self, din, dhidden, dout, *, rngs: nnx.Rngs):
        self.linear1 = nnx.Linear(din, dhidden, use_bias=False, rngs=rngs)
        self.linear2 = nnx.Linear(dhidden, dout, use_bias=False, rngs=rngs)

      def __call__(self, x):
        return self.linear2(jax.nn.relu(self.linear1(x)))

    m = MLP(2, 64, 3, rngs=nnx.Rngs(0))
    x = jnp.ones((32, 2))

    def path_ends_with(path_suffix):
      return lambda path, value: path[-len(path_suffix) :] == path_suffix

    model_sharding = nnx.StateSharding(
      {
        path_ends_with(('linear1', 'kernel')): P(None, 'model'),
        path_ends_with(('linear2', 'kernel')): P('model', None),
      }
    )

    @nnx.shard_map(
        mesh=mesh,
        in_specs=(model_sharding, P(None)),
        out_specs=P(None),
        graph=True,
        graph_updates=True,
    )
    def f(m, x):
      self.assertEqual(m.linear1.kernel.shape, (2, 64 // n_devices))
      self.assertEqual(m.linear2.kernel.shape, (64 // n_devices, 3))
      y = m(x)
      return jax.lax.psum(y, 'model')

    y = f(m, x)
    self.assertEqual(y.shape, (32, 3))
    self.assertEqual(y.sharding.spec, P(None))

  @parameterized.parameters(True, False)
  def test_simple_tensor_parallel_functional(self, graph):
    n_devices = jax.local_device_count()
    P = jax.sharding.PartitionSpec

    mesh = jax.sharding.Mesh(jax.local_devices(), ('model',))

    class MLP(nnx.Module):

      def __init__(self, din, dhidden, dout, *, rngs: nnx.Rngs):
        self.linear1 = nnx.Linear(din, dhidden, use_bias=False, rngs=rngs)
        self.linear2 = nnx.Linear(dhidden, dout, use_bias=False, rngs=rngs)

      def __call__(self, x):
        return self.linear2(jax.nn.relu(self.linear1(x)))

    m = MLP(2, 64, 3, rngs=nnx.Rngs(0))
    x = jnp.ones((32, 2))

    def path_ends_with(path_suffix):
      return lambda path, value: path[-len(path_suffix) :] == path_suffix

    model_sharding = nnx.prefix(
        m,
        {
            path_ends_with(('linear1', 'kernel')): P(None, 'model'),
            path_ends_with(('linear2', 'kernel')): P('model', None),
        },
        graph=graph,
    )

    @nnx.shard_map(
        mesh=mesh,
        in_specs=(model_sharding, P(None)),
        out_specs=P(None),
        graph=graph,
        graph_updates=False,
    )
    def f(m, x):
      self.assertEqual(m.linear1.kernel.shape, (2, 64 // n_devices))
      self.assertEqual(m.linear2.kernel.shape, (64 // n_devices, 3))
      y = m(x)
      return jax.lax.psum(y, 'model')

    y = f(m, x)
    self.assertEqual(y.shape, (32, 3))
    self.assertEqual(y.sharding.spec, P(None))

  @parameterized.parameters(
    (True, True), (True, False), (False, False),
  )
  def test_shardmap_with_sharding_names(self, graph, graph_updates):
    n_devices = jax.local_device_count()
    P = jax.sharding.PartitionSpec
    mesh = jax.sharding.Mesh(jax.local_devices(), ('data',))

    with jax.set_mesh(mesh):
      w = nnx.Param(jnp.ones((8, 4)), out_sharding=('data', None))
      b = nnx.Param(jnp.ones((4,)), out_sharding=(None,))

    self.assertIsInstance(w.get_raw_value().sharding, jax.sharding.NamedSharding)
    self.assertEqual(w.out_sharding, ('data', None))
    self.assertEqual(b.out_sharding, (None,))

    @nnx.shard_map(
      mesh=mesh, in_specs=(P('data', None), P(None)), out_specs=P('data', None),
      graph=graph, graph_updates=graph_updates,
    )
    def f(w, b):
      self.assertEqual(w.shape, (8 // n_devices, 4))
      self.assertEqual(b.shape, (4,))
      return w + b[None]

    y = f(w, b)
    self.assertEqual(y.shape, (8, 4))
    self.assertIsInstance(y.sharding, jax.sharding.NamedSharding)

  @parameterized.parameters(
    (True, True), (True, False), (False, False),
  )
  def test_shardmap_sharding_names_mutation(self, graph, graph_updates):
    n_devices = jax.local_device_count()
    P = jax.sharding.PartitionSpec
    mesh = jax.sharding.Mesh(jax.local_devices(), ('data',))

    with jax.set_mesh(mesh):
      w = nnx.Param(jnp.zeros((8, 4)), out_sharding=('data', None))
      count = nnx.BatchStat(jnp.array(0))

    @nnx.shard_map(
      mesh=mesh, in_specs=(P('data', None), P()), out_specs=P('data', None),
      graph=graph, graph_updates=graph_updates,
    )
    def f(w, count):
      count[...] += 1
      self.assertEqual(w.shape, (8 // n_devices, 4))
      return w + 1.0

    y = f(w, count)
    self.assertEqual(count[...], 1)
    self.assertEqual(y.shape, (8, 4))
    np.testing.assert_allclose(w[...], jnp.zeros((8, 4)))

  @parameterized.parameters(
    (True, True),
    (True, False),
    (False, False),
  )
  def test_shardmap_shared_variable(self, graph, graph_updates):
    P = jax.sharding.PartitionSpec
    mesh = jax.sharding.Mesh(jax.local_devices(), ('data',))

    v = nnx.Param(jnp.array(1.0))

    class Container(nnx.Module):
      def __init__(self, v):
        self.v = v

    c1 = Container(v)
    c2 = Container(v)

    @nnx.shard_map(
      mesh=mesh, in_specs=(P(), P(), P()), out_specs=P(),
      graph=graph, graph_updates=graph_updates,
    )
    def f(c1, c2, x):
      c1.v[...] += x
      return c1.v[...] + c2.v[...]

    if not graph and not graph_updates:
      with self.assertRaises(ValueError):
        f(c1, c2, jnp.array(1.0))
    else:
      y = f(c1, c2, jnp.array(1.0))
      np.testing.assert_allclose(y, 4.0)
      np.testing.assert_allclose(v[...], 2.0)

  @parameterized.parameters(
    (True, True), (True, False), (False, False),
  )
  def test_shardmap_module_variable_update(self, graph, graph_updates):
    P = jax.sharding.PartitionSpec
    mesh = jax.sharding.Mesh(jax.local_devices(), ('data',))

    class Foo(nnx.Module):
      def __init__(self):
        self.count = nnx.Variable(jnp.array(0))

    m = Foo()

    @nnx.shard_map(
      mesh=mesh, in_specs=(P(), P()), out_specs=P(),
      graph=graph, graph_updates=graph_updates,
    )
    def f(m, x):
      m.count[...] += 1
      return x * 2

    y = f(m, jnp.array(3.0))
    np.testing.assert_allclose(y, 6.0)
    self.assertEqual(m.count[...], 1)
    y = f(m, jnp.array(3.0))
    self.assertEqual(m.count[...], 2)

  @parameterized.parameters(
    (True, True),
    (True, False),
  )
  def test_shard_map_inconsistent_aliasing(self, graph, graph_updates):
    v = nnx.Param(jnp.array(1.0))
    P = jax.sharding.PartitionSpec
    mesh = jax.sharding.Mesh(jax.devices(), ('x',))

    @nnx.shard_map(
      mesh=mesh,
      in_specs=(P(), P('x')),
      out_specs=P(),
      graph=graph, graph_updates=graph_updates,
    )
    def f(a, b):
      return a[...] + b[...]

    with self.assertRaisesRegex(ValueError, 'Inconsistent aliasing'):
      f(v, v)


