"""The dropless MoE (`workloads.common.dropless_moe`): every token reaches exactly its top-k
experts at any load, equal in float32 (values and gradients) to a dense reference that runs
every expert on every token and masks by the routing; expert parallelism over the 8 test
devices gives the one-device results; megablox's gmm (Pallas's interpreter) and the
chunked loop (the CPU's kernel, which the tests above run) compute NumPy's grouped products.

Cheap by design (the suite's budget): small shapes, and the compiled programs shared
between tests (`_program`, `_dense_program`); XLA's ragged_dot is checked through the
layer (the FSDP case), not on its own."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlbench.train import mesh as mesh_lib
from workloads.common import dropless_moe
from workloads.common.grouped_matmul import Grouped, grouped_matmul

B, T, M, E, F, K = 8, 16, 16, 8, 24, 4
LOADS = ("random", "every token to the same experts")


def _params(load: str, seed: int = 0):
  """x [B, T, M], router [M, E], wi_gate, wi_up [E, M, F], wo [E, F, M] (float32). The
  skewed load: a feature every token has, which the router weighs towards experts 0-3
  (with experts 4-7 on other devices, so the receive buffer fills up to its worst case)."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(B, T, M)).astype(np.float32)
  router = rng.normal(size=(M, E)).astype(np.float32)
  if load != "random":
    x[..., 0] = 10.0
    router[0] = [9.0, 8.0, 7.0, 6.0, 0.0, 0.0, 0.0, 0.0]
  experts = [(rng.normal(size=s) / 4).astype(np.float32) for s in ((E, M, F),) * 2 + ((E, F, M),)]
  return [jnp.asarray(a) for a in (x, router, *experts)]


def dense(x, router, wi_gate, wi_up, wo):
  """Every expert on every token, each token's output the gate-weighted sum of the
  experts in its top k (a softmax over their logits), the others masked out."""
  logits = jnp.einsum("btm,me->bte", x, router)
  kth = jnp.sort(logits, axis=-1)[..., -K][..., None]
  chosen = logits >= kth
  gates = jax.nn.softmax(jnp.where(chosen, logits, -jnp.inf), axis=-1)
  h = (jax.nn.silu(jnp.einsum("btm,emf->btef", x, wi_gate))
       * jnp.einsum("btm,emf->btef", x, wi_up))
  return jnp.einsum("btef,efm,bte->btm", h, wo, gates)


def _loss(fn):
  weights = jnp.asarray(np.linspace(-1, 1, M), jnp.float32)
  return lambda *p: jnp.sum(fn(*p) * weights)


@functools.cache
def _program(shape: tuple[tuple[str, int], ...] | None, grouped: Grouped = Grouped.AUTO):
  """jit of (y, gradients of every input) of the layer on `shape`'s mesh (None: one
  program), shared by the tests."""
  mesh = None if shape is None else mesh_lib.make_mesh(dict(shape))
  layer = functools.partial(dropless_moe.dropless_ffn, k=K, mesh=mesh, grouped=grouped)
  grads = jax.grad(_loss(layer), argnums=tuple(range(5)))
  return jax.jit(lambda *p: (layer(*p), grads(*p)))


@functools.cache
def _dense_program():
  return jax.jit(lambda *p: (dense(*p), jax.grad(_loss(dense), argnums=tuple(range(5)))(*p)))


@pytest.mark.parametrize("load", LOADS)
def test_every_token_reaches_exactly_its_top_k_experts_as_a_dense_reference(load):
  params = _params(load)
  y, grads = _program(None)(*params)
  want_y, want = _dense_program()(*params)
  np.testing.assert_allclose(np.asarray(y), np.asarray(want_y), rtol=1e-5, atol=1e-5)
  for name, got, ref in zip(("x", "router", "wi_gate", "wi_up", "wo"), grads, want):
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-4, atol=1e-4,
                               err_msg=name)
  if load != "random":  # every token's top 4 are experts 0-3: 4 of 8 experts get it all
    logits = jnp.einsum("btm,me->bte", params[0], params[1])
    assert set(np.unique(np.asarray(dropless_moe.route(logits, K)[0]))) == {0, 1, 2, 3}


def test_the_router_is_float32_and_its_gates_a_softmax_over_the_top_k():
  logits = jnp.asarray([[0.5, 3.0, -1.0, 2.0, 1.0]], jnp.bfloat16)
  experts, gates = dropless_moe.route(logits, 3)
  assert gates.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(experts), [[1, 3, 4]])
  want = np.exp([3.0, 2.0, 1.0]) / np.exp([3.0, 2.0, 1.0]).sum()
  np.testing.assert_allclose(np.asarray(gates), [want], rtol=1e-6)


@pytest.mark.parametrize("shape, grouped", [
    # One expert a device: a token sends it at most one row (the buffer's sizing).
    ((("expert", 8),), Grouped.AUTO),
    # FSDP (no expert axis): every device runs every expert on its own tokens.
    ((("data", 8),), Grouped.RAGGED_DOT),
    # megablox gmm per device (interpreted): shard_map without its vma checks, which a
    # Pallas kernel's untyped outputs fail; `model` replicates the layer, which must not
    # add its gradients up twice.
    ((("data", 2), ("model", 2), ("expert", 2)), Grouped.GMM)])
@pytest.mark.parametrize("load", LOADS)
def test_expert_parallel_gives_the_single_device_outputs_and_gradients(shape, grouped, load):
  params = _params(load, seed=1)
  y1, grads1 = _program(None)(*params)
  y8, grads8 = _program(shape, grouped)(*params)
  np.testing.assert_allclose(np.asarray(y8), np.asarray(y1), rtol=1e-5, atol=1e-5)
  for g1, g8 in zip(grads1, grads8):
    np.testing.assert_allclose(np.asarray(g8), np.asarray(g1), rtol=1e-4, atol=1e-5)


def test_the_module_has_the_interface_parameters_and_computes_in_its_dtype():
  layer = dropless_moe.DroplessMoE(experts=E, top_k=K, hidden=M, ffn=F, dtype=jnp.bfloat16,
                                   param_dtype=jnp.float32, init_std=0.008,
                                   grouped=Grouped.RAGGED_DOT)  # the quickest to compile
  x = _params("random")[0]
  y, variables = jax.jit(layer.init_with_output)(jax.random.key(0), x)  # one compile
  shapes = jax.tree.map(lambda a: (a.shape, a.dtype.name), variables["params"])
  assert shapes == {"router": ((M, E), "float32"), "wi_gate": ((E, M, F), "float32"),
                    "wi_up": ((E, M, F), "float32"), "wo": ((E, F, M), "float32")}
  assert float(jnp.std(variables["params"]["wi_gate"])) == pytest.approx(0.008, rel=0.05)
  assert y.shape == x.shape and y.dtype == jnp.bfloat16


def test_megablox_gmm_and_the_chunked_loop_compute_the_grouped_products_and_gradients():
  """Against NumPy: rows [0, 100) by w[0], none by w[1], [100, 160) by w[2], [160, 216)
  by w[3]; the last 40 rows are in no group (unspecified from gmm: left out). The loss
  sum(y[:216]^2) has gradients 2 y w^T (rows) and x^T 2 y (each group's matrix)."""
  rng = np.random.default_rng(2)
  x = rng.normal(size=(256, 128)).astype(np.float32)
  w = (rng.normal(size=(4, 128, 128)) / 8).astype(np.float32)
  bounds = [0, 100, 100, 160, 216]
  used = bounds[-1]
  want_y, want_gx, want_gw = np.zeros((used, 128)), np.zeros((used, 128)), np.zeros(w.shape)
  for g in range(4):
    rows = slice(bounds[g], bounds[g + 1])
    want_y[rows] = x[rows].astype(np.float64) @ w[g]
    want_gx[rows] = 2 * want_y[rows] @ w[g].T
    want_gw[g] = x[rows].T.astype(np.float64) @ (2 * want_y[rows])
  sizes = jnp.asarray(np.diff(bounds), jnp.int32)

  def run(kernel):
    mm = functools.partial(grouped_matmul, sizes_G=sizes, kernel=kernel, platform="cpu")

    def loss(x, w):
      return jnp.sum(mm(x, w)[:used] ** 2)

    return jax.jit(lambda x, w: (mm(x, w)[:used], jax.grad(loss, (0, 1))(x, w)))(x, w)

  for kernel in (Grouped.GMM, Grouped.CHUNKED):  # ragged_dot: the FSDP case above
    y, (gx, gw) = run(kernel)
    np.testing.assert_allclose(np.asarray(y), want_y, rtol=1e-4, atol=1e-4, err_msg=kernel.value)
    np.testing.assert_allclose(np.asarray(gx)[:used], want_gx, rtol=1e-4, atol=1e-3,
                               err_msg=kernel.value)
    np.testing.assert_allclose(np.asarray(gw), want_gw, rtol=1e-4, atol=1e-3,
                               err_msg=kernel.value)
