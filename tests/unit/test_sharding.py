"""Logical partition rules applied to the whole train state, on 8 simulated devices."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
import pytest
from jax.sharding import PartitionSpec as P

from mlbench.train import mesh as mesh_lib, sharding
from mlbench.errors import UserError

RULES = [(r"mlp/wi/kernel$", P("embed", "mlp")), (r"mlp/wo/kernel$", P("mlp", "embed")),
         (r"embedding$", P("vocab", "embed"))]


def _state():
  params = {"mlp": {"wi": {"kernel": jnp.zeros((16, 64))}, "wo": {"kernel": jnp.zeros((64, 16))}},
            "embedding": jnp.zeros((32, 16)), "norm": {"scale": jnp.ones((16,))}}
  return {"params": params, "opt_state": optax.adam(1e-3).init(params)}


def test_rules_shard_params_and_the_optimizer_state_that_mirrors_them():
  mesh = mesh_lib.make_mesh({"data": 4, "model": 2})
  shapes = jax.eval_shape(_state)
  sh = sharding.tree_shardings(shapes, RULES, mesh)
  assert sh["params"]["mlp"]["wi"]["kernel"].spec == P(None, "model")
  assert sh["params"]["mlp"]["wo"]["kernel"].spec == P("model")
  assert sh["params"]["embedding"].spec == P("model")
  assert sh["params"]["norm"]["scale"].spec == P()
  mu = sh["opt_state"][0].mu
  assert mu["mlp"]["wi"]["kernel"].spec == P(None, "model")
  assert mu["embedding"].spec == P("model")
  assert sh["opt_state"][0].count.spec == P()
  # Materialised sharded: each device holds half of the mirrored Adam moment.
  state = jax.jit(_state, out_shardings=sh)()
  shard = state["opt_state"][0].mu["mlp"]["wi"]["kernel"].addressable_shards[0]
  assert shard.data.shape == (16, 32)


def test_a_data_only_mesh_replicates_everything():
  mesh = mesh_lib.make_mesh()
  sh = sharding.tree_shardings(jax.eval_shape(_state), RULES, mesh)
  assert all(s.spec == P() for s in jax.tree.leaves(sh))
  assert mesh.shape == {"data": 8}


def test_bad_rules_and_meshes_are_clear_errors():
  mesh = mesh_lib.make_mesh({"data": 4, "model": 2})
  with pytest.raises(UserError, match="unknown logical axis 'hidden'"):
    sharding.tree_shardings(jax.eval_shape(_state), [("mlp/wi/kernel$", P("hidden"))], mesh)
  with pytest.raises(UserError, match="has 3 axes but the array has 2"):
    sharding.tree_shardings(jax.eval_shape(_state), [("embedding$", P(None, None, "mlp"))], mesh)
  with pytest.raises(UserError, match="needs 6 devices, there are 8"):
    mesh_lib.make_mesh({"data": 3, "model": 2})
  with pytest.raises(UserError, match="unknown mesh axis"):
    mesh_lib.make_mesh({"data": 4, "tensor": 2})


def test_local_rows_reassemble_a_batch_in_order():
  import numpy as np

  mesh = mesh_lib.make_mesh({"data": 4, "model": 2})
  x = np.arange(16 * 3).reshape(16, 3)
  g = mesh_lib.to_global({"x": x}, mesh_lib.batch_sharding(mesh), 16)["x"]
  np.testing.assert_array_equal(mesh_lib.local_rows(g), x)
