"""The fused attention that drops out (`mlbench.train.attention.dropout_kernel`), in Pallas's
interpreter on the CPU, against XLA's attention: without dropout the same attention; with
dropout the same attention under the same mask (XLA draws it with the kernel's hash,
`dropout_bits`), forward and gradients, under `shard_map` on the 8 test devices too;
the mask's keep rate and how it changes between steps, layers, rows and heads; packed
sequences that never see each other; a backward pass that draws the forward's mask
again (gradients against finite differences); the entry point's choice and reason; and
the kernels compiled by the TPU compiler for v4 with their declared cost."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlbench.fields import AttentionImpl as Impl
from mlbench.train import attention, mesh as mesh_lib
from mlbench.train.attention import dropout_bits, dropout_kernel

# Row 0: sequences of 100 and 100 tokens, then padding; row 1: 100 and 156 tokens.
SEGMENTS = np.where(np.arange(256)[None] < np.array([[200], [256]]),
                    1 + (np.arange(256)[None] >= 100), 0).astype(np.int32)
PACKED = dict(q_segments_BL=SEGMENTS, kv_segments_BS=SEGMENTS)


def _qkv(batch: int, length: int, kv_len: int, heads: int, kv_heads: int, d: int = 16,
         seed: int = 0) -> list[jax.Array]:
  rng = np.random.default_rng(seed)
  return [jnp.asarray(rng.standard_normal((batch, n, h, d)), jnp.float32)
          for n, h in ((length, heads), (kv_len, kv_heads), (kv_len, kv_heads))]


def _grads(impl: Impl | Any, qkv: list[jax.Array], masks: dict, dropout=None, mesh=None):
  """(output, gradients of a weighted sum of it over the real queries) by `impl`: an
  implementation `attend` runs, or a function of (q, k, v)."""
  real = jnp.asarray(masks["q_segments_BL"] > 0 if "q_segments_BL" in masks
                     else np.ones(qkv[0].shape[:2], bool))
  weights = jnp.asarray(np.linspace(-1, 1, qkv[0].shape[-1]), jnp.float32)

  def loss(q, k, v):
    if callable(impl):
      out = impl(q, k, v)
    else:
      out = attention.attend(q, k, v, implementation=impl, mesh=mesh, dropout=dropout,
                             **{n: m if isinstance(m, bool) else jnp.asarray(m)
                                for n, m in masks.items()})
    return (out * weights * real[..., None, None]).sum(), out

  (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(*qkv)
  return np.where(np.asarray(real)[..., None, None], out, 0), grads


def _same(kernel, reference, tol=2e-5):
  (out, grads), (want, want_grads) = kernel, reference
  np.testing.assert_allclose(out, want, atol=tol, rtol=tol)
  for got, ref in zip(grads, want_grads):
    np.testing.assert_allclose(got, ref, atol=5 * tol, rtol=5 * tol)


def _dropout(rate: float, key: int = 0) -> attention.Dropout:
  return attention.Dropout(rate, jax.random.key(key))  # no `apply`: XLA uses the kernel's mask


# name: (B, L, S, N, K, masks); masks as `attend` takes them
CASES = {
    # Packed BERT rows, the kernel's single-chunk path; grouped-query heads.
    "packed": (2, 256, 256, 4, 2, PACKED),
    # The Transformer decoder's causal self-attention; 3 query blocks x 3 key chunks of 128.
    "causal, 3 x 3 blocks": (1, 384, 384, 2, 2, dict(causal=True)),
    # Its cross-attention: 128 queries, 256 keys with padding.
    "cross, padded keys": (2, 128, 256, 2, 2, dict(kv_segments_BS=SEGMENTS > 0)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_with_dropout_the_kernel_is_xla_under_the_same_mask(case):
  b, length, kv_len, heads, kv_heads, masks = CASES[case]
  qkv = _qkv(b, length, kv_len, heads, kv_heads)
  drop = _dropout(0.1)
  _same(_grads(Impl.PALLAS, qkv, masks, drop), _grads(Impl.XLA, qkv, masks, drop))


def test_without_dropout_the_kernel_is_xlas_attention():
  # Rate 0 never reaches the kernel through `attend` (splash serves it): call it directly.
  qkv = _qkv(2, 256, 256, 4, 2)
  spec = dropout_kernel.Spec(causal=False, rate=0.0, heads=4, segments=True, interpret=True)
  seg = jnp.asarray(SEGMENTS)[:, None, :]

  def kernel(q, k, v):
    q = q * 16 ** -0.5
    out = dropout_kernel.attend(spec, *(x.transpose(0, 2, 1, 3) for x in (q, k, v)),
                                seg, seg, jnp.zeros(4, jnp.int32))
    return out.transpose(0, 2, 1, 3)

  _same(_grads(kernel, qkv, PACKED), _grads(Impl.XLA, qkv, PACKED))


def test_under_shard_map_each_device_draws_its_rows_and_heads_share_of_one_mask():
  # data=4 x model=2: a device holds one row and one of the two heads; its bits are
  # numbered by global row and head, so the whole is XLA's single [B, N, L, S] mask.
  mesh = mesh_lib.make_mesh({"data": 4, "model": 2})
  qkv = _qkv(4, 256, 256, 2, 2, seed=1)
  masks = {k: np.concatenate([m, m]) for k, m in PACKED.items()}
  drop = _dropout(0.1, key=7)
  _same(_grads(Impl.PALLAS, qkv, masks, drop, mesh), _grads(Impl.XLA, qkv, masks, drop, mesh))


def _agreement(a: np.ndarray, b: np.ndarray) -> float:
  return float((a == b).mean())


def test_the_mask_keeps_nine_in_ten_and_changes_with_step_layer_row_and_head():
  """1,048,576 scores a mask: the kept fraction's standard deviation is
  sqrt(0.9 * 0.1 / n) = 0.00029 (0.0012 per row and head, n = 65,536); bounds at six of
  them. Two independent masks agree on 0.9^2 + 0.1^2 = 0.82 of the scores."""
  step_key = jax.random.key(42)
  keys = {(step, layer): jax.random.fold_in(jax.random.fold_in(step_key, step), layer)
          for step in (0, 1) for layer in (0, 1)}
  mask = jax.jit(lambda k: dropout_bits.keep_mask(dropout_bits.seeds(k), 4, 4, 256, 256, 0.1))
  masks = {sl: np.asarray(mask(k)) for sl, k in keys.items()}
  for mask in masks.values():
    assert abs(mask.mean() - 0.9) < 6 * 0.00029
    assert np.all(np.abs(mask.mean(axis=(2, 3)) - 0.9) < 6 * 0.0012)
  sd = 6 * np.sqrt(0.82 * 0.18 / masks[0, 0].size)
  pairs = [((0, 0), (1, 0)), ((0, 0), (0, 1)), ((0, 1), (1, 1))]  # steps; layers
  for a, b in pairs:
    assert abs(_agreement(masks[a], masks[b]) - 0.82) < sd, (a, b)
  one = masks[0, 0]
  sd = 6 * np.sqrt(0.82 * 0.18 / one[0, 0].size)
  assert abs(_agreement(one[0, 0], one[0, 1]) - 0.82) < sd      # heads
  assert abs(_agreement(one[0, 0], one[1, 0]) - 0.82) < sd      # rows
  assert abs(_agreement(one[0, 0, :128], one[0, 0, 128:]) - 0.82) < 6 * sd  # query blocks


def test_the_workloads_attention_draws_new_masks_each_step_and_layer():
  """BERT's and the Transformer's `Attention` (workloads/common/transformer.py), two layers
  with the same weights on the same input, on the kernel: a layer's key for the step
  (`make_rng`) makes the two layers' outputs differ, and a step's from the next's."""
  import flax.linen as nn

  from workloads.common import transformer as blocks

  class Two(nn.Module):
    @nn.compact
    def __call__(self, x):
      layer = lambda name: blocks.Attention(  # noqa: E731
          2, 8, dropout=0.5, implementation=Impl.PALLAS, name=name)
      return layer("one")(x, deterministic=False), layer("two")(x, deterministic=False)

  x = jnp.asarray(np.random.default_rng(10).standard_normal((1, 128, 16)), jnp.float32)
  model = Two()
  weights = blocks.Attention(2, 8).init(jax.random.key(0), x)["params"]  # XLA's, cheap
  params = {"one": weights, "two": weights}
  run = jax.jit(lambda key: model.apply({"params": params}, x, rngs={"dropout": key}))
  (one, two), (one_next, _) = run(jax.random.key(1)), run(jax.random.key(2))
  assert not np.allclose(one, two) and not np.allclose(one, one_next)
  np.testing.assert_array_equal(run(jax.random.key(1))[0], one)  # a step's mask is its own


def test_dropping_with_the_kernels_mask_keeps_the_attention_in_expectation():
  """The same attention in expectation as without dropout (what "the same losses in
  expectation" needs): 64 masks' mean of dropped probabilities against the probabilities.
  A dropped-and-scaled probability p has standard deviation p sqrt(rate / (1 - rate)),
  p / 3 at 0.1: over 64 masks p / 24; bound at six of them."""
  logits = np.random.default_rng(8).standard_normal((1, 1, 128, 128))
  probs = (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).astype(np.float32)

  @jax.jit
  def mean(keys):
    drop = lambda key: dropout_bits.apply(dropout_bits.seeds(key), 0.1, probs)  # noqa: E731
    return jax.vmap(drop)(keys).mean(0)

  got = np.asarray(mean(jax.random.split(jax.random.key(9), 64)))
  assert np.all(np.abs(got - probs) < 6 * probs / 24)


def test_a_changed_sequence_leaves_its_row_mates_alone_with_dropout_on():
  # Row 1 packs tokens [0, 100) and [100, 256): new queries, keys and values for the
  # second sequence leave the first one's outputs as they were, to the bit.
  qkv = _qkv(2, 256, 256, 2, 2, seed=3)
  changed = [x.at[1, 100:].set(x[1, 100:] * -2.0 + 1.0) for x in qkv]
  drop = _dropout(0.1, key=11)
  masks = {n: jnp.asarray(m) for n, m in PACKED.items()}
  attend = jax.jit(lambda q, k, v: attention.attend(q, k, v, implementation=Impl.PALLAS,
                                                    dropout=drop, **masks))
  before, after = (np.asarray(attend(*inputs)) for inputs in (qkv, changed))
  np.testing.assert_array_equal(before[1, :100], after[1, :100])
  np.testing.assert_array_equal(before[0], after[0])
  assert not np.allclose(before[1, 100:], after[1, 100:])


def test_the_backward_pass_draws_the_forwards_mask_again():
  """Gradients against central differences, along one random direction per input: a
  backward pass with any other mask than the forward's is off by about the dropped
  share of the gradient (a third at rate 0.3), the differences by 1e-3 of it."""
  qkv = _qkv(1, 128, 128, 1, 1, d=8, seed=5)
  drop = _dropout(0.3, key=13)
  weights = jnp.asarray(np.random.default_rng(6).standard_normal((1, 128, 1, 8)), jnp.float32)

  def loss(q, k, v):
    out = attention.attend(q, k, v, implementation=Impl.PALLAS, dropout=drop, causal=True)
    return (out * weights).sum()

  grads = jax.jit(jax.grad(loss, (0, 1, 2)))(*qkv)
  f = jax.jit(loss)
  rng = np.random.default_rng(7)
  for i, g in enumerate(grads):
    direction = jnp.asarray(rng.standard_normal(g.shape), jnp.float32)
    step = 1e-2
    plus, minus = ([x + s * step * direction if j == i else x for j, x in enumerate(qkv)]
                   for s in (1, -1))
    numeric = (f(*plus) - f(*minus)) / (2 * step)
    assert float((g * direction).sum()) == pytest.approx(float(numeric), rel=2e-3)


def test_the_kernels_compile_for_a_v4_slice_declare_their_cost_and_say_so():
  """The TPU compiler (libtpu, no TPU) compiles a train step's attention with dropout on
  4 chips of v4: the entry point picks the kernel and its line (what `check` prints and
  a run logs) says so; both kernels (forward, backward) carry a cost estimate, so XLA's
  step estimate counts them (mlbench/pod/xlacost.py) and its FLOPs include theirs."""
  pytest.importorskip("libtpu")
  from jax.sharding import NamedSharding, PartitionSpec as P

  from mlbench.pod import topology, xlacost

  mesh = mesh_lib.make_mesh({"data": 4}, topology.devices(topology.parse("v4-8")))
  rows = NamedSharding(mesh, P("data"))
  qkv = [jax.ShapeDtypeStruct((4, 256, 2, 64), jnp.bfloat16, sharding=rows)] * 3
  seg = jax.ShapeDtypeStruct((4, 256), jnp.int32, sharding=rows)
  key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=NamedSharding(mesh, P()))

  def grads(q, k, v, seg, key_data):
    drop = attention.Dropout(0.1, jax.random.wrap_key_data(key_data))

    def loss(q, k, v):
      out = attention.attend(q, k, v, dropout=drop, q_segments_BL=seg, kv_segments_BS=seg)
      return out.astype(jnp.float32).sum()

    return jax.value_and_grad(loss, (0, 1, 2))(q, k, v)

  with attention.recording() as used:
    with attention.program("train step", mesh):
      lowered = jax.jit(grads).lower(*qkv, seg, key)
  with jax.default_device(jax.devices("cpu")[0]):
    compiled = lowered.compile()
  assert [u.line() for u in used] == [
      "train step: attention, 256 x 256 tokens, 2 heads of 64, bfloat16, padding, segments, "
      "dropout 0.1: pallas - Pallas fused attention with the dropout in the kernel (mlbench's)"]
  text = compiled.as_text()
  assert text.count('custom_call_target="tpu_custom_call"') == 2
  assert xlacost.custom_calls(text).uncosted_kernels == 0
  estimate = xlacost.of_compiled(compiled)
  assert estimate.seconds is not None and estimate.seconds > 0, estimate
  # A device's row: 2 heads x 256 x 256 scores, 4 matmul FLOPs per score and head size
  # forward, 10 backward (QK^T again, dO V^T, dS K, dS^T Q, P^T dO).
  matmuls = 2 * 256 * 256 * 64 * (4 + 10)
  assert xlacost.cost_analysis(compiled)["flops"] > matmuls
