"""The attention entry point (`mlbench.train.attention`): every implementation's output and
gradients against a float64 einsum reference (causal, padding, packed sequences, grouped-
query heads, cross-attention, a bias), the TPU kernels in Pallas's interpret mode and under
`shard_map` on the 8 test devices; the choice per platform and shape, and its one-line
errors. cuDNN runs only where a GPU is (never in CI)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlbench.errors import UserError
from mlbench.fields import AttentionImpl as Impl
from mlbench.train import attention, mesh as mesh_lib

LENGTHS = np.array([256, 130])
SEGMENTS = np.where(np.arange(256)[None] < np.array([[200], [256]]),
                    1 + (np.arange(256)[None] >= 100), 0)  # two sentences, then padding

# name: (L, S, N, K, D, masks); a batch of 2
CASES = {
    "causal, grouped-query": (256, 256, 4, 2, 32, dict(causal=True)),
    "padding": (256, 256, 4, 4, 32, dict(kv_lengths_B=LENGTHS)),
    "segments, causal": (256, 256, 4, 4, 32, dict(causal=True, q_segments_BL=SEGMENTS,
                                                   kv_segments_BS=SEGMENTS)),
    # Packed BERT rows: bidirectional attention within each sequence.
    "segments": (256, 256, 4, 4, 32, dict(q_segments_BL=SEGMENTS, kv_segments_BS=SEGMENTS)),
    "cross-attention, padded keys": (128, 256, 4, 2, 32, dict(kv_segments_BS=SEGMENTS > 0)),
    "bias, padding": (256, 256, 4, 2, 32, dict(bias="bias", kv_lengths_B=LENGTHS)),
}


def _inputs(case: str, copies: int = 1) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
  """(q, k, v) and the masks of `case`, its batch of 2 repeated `copies` times."""
  length, kv_len, heads, kv_heads, d, masks = CASES[case]
  rng = np.random.default_rng(len(case))
  qkv = [np.concatenate([rng.standard_normal((2, n, h, d))] * copies)
         for n, h in ((length, heads), (kv_len, kv_heads), (kv_len, kv_heads))]
  masks = {k: m if isinstance(m, bool) else np.concatenate([m] * copies)
           for k, m in masks.items() if k != "bias"}
  if "bias" in CASES[case][-1]:
    masks["bias"] = rng.standard_normal((1, heads, length, kv_len)).astype(np.float32)
  return qkv, masks


def _allowed(q: np.ndarray, k: np.ndarray, masks: dict) -> tuple[np.ndarray, np.ndarray]:
  """([B, L, S] True where a query may attend to a key, [B, L] True at the real queries)."""
  b, length, kv_len = q.shape[0], q.shape[1], k.shape[1]
  allowed, real = np.ones((b, length, kv_len), bool), np.ones((b, length), bool)
  if masks.get("causal"):
    allowed &= np.tril(np.ones((length, kv_len), bool))[None]
  if "kv_lengths_B" in masks:
    allowed &= (np.arange(kv_len)[None] < masks["kv_lengths_B"][:, None])[:, None]
    real &= np.arange(length)[None] < masks["kv_lengths_B"][:, None]
  if "kv_segments_BS" in masks:
    q_seg = masks.get("q_segments_BL", np.ones((b, length), int))
    allowed &= q_seg[:, :, None] == masks["kv_segments_BS"][:, None, :]
    real &= q_seg > 0
  return allowed, real


def reference(q, k, v, masks):
  """softmax(q k^T / sqrt(D) + bias, masked) v in plain einsums (key/value heads
  repeated), in the inputs' precision: float64 for the reference values and gradients."""
  group = q.shape[2] // k.shape[2]
  k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
  logits = jnp.einsum("blnd,bsnd->bnls", q, k) / np.sqrt(q.shape[-1])
  if masks.get("bias") is not None:
    logits = logits + masks["bias"]
  allowed, _ = _allowed(q, k, masks)
  logits = jnp.where(allowed[:, None], logits, -1e30)
  return jnp.einsum("bnls,bsnd->blnd", jax.nn.softmax(logits, axis=-1), v)


def _weighted(out: jax.Array, real: np.ndarray) -> jax.Array:
  """sum(out * weights) over the real queries: what every gradient is taken of."""
  weights = jnp.asarray(np.linspace(-1, 1, out.shape[-1]))
  return (out.astype(jnp.float32) * weights * jnp.asarray(real)[..., None, None]).sum()


def _value_and_grads(impl: Impl, qkv, masks: dict, real: np.ndarray, dtype, mesh=None):
  def loss(q, k, v):
    out = attention.attend(q, k, v, implementation=impl, mesh=mesh,
                           **{key: m if isinstance(m, bool) else jnp.asarray(m)
                              for key, m in masks.items()})
    return _weighted(out, real), out

  (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(
      *(jnp.asarray(x, dtype) for x in qkv))
  return np.asarray(out, np.float64), [np.asarray(g, np.float64) for g in grads]


def _gpu() -> bool:
  try:
    return bool(jax.devices("gpu"))
  except RuntimeError:
    return False


IMPLS = [Impl.XLA, Impl.PALLAS,
         pytest.param(Impl.CUDNN, marks=pytest.mark.skipif(not _gpu(), reason="no GPU"))]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", list(CASES))
def test_every_implementation_computes_the_reference_attention(case, impl):
  qkv, masks = _inputs(case)
  dtype = jnp.bfloat16 if impl is Impl.CUDNN else jnp.float32  # cuDNN takes no float32
  tol = 3e-2 if dtype == jnp.bfloat16 else 2e-5
  _, real = _allowed(qkv[0], qkv[1], masks)
  out, grads = _value_and_grads(impl, qkv, masks, real, dtype)
  with jax.enable_x64(True):
    wide = [jnp.asarray(x, jnp.float64) for x in qkv]
    want = np.asarray(reference(*wide, masks))
    want_grads = jax.grad(lambda *a: _weighted(reference(*a, masks), real).astype(jnp.float64),
                          argnums=(0, 1, 2))(*wide)
  np.testing.assert_allclose(out[real], want[real], atol=tol, rtol=tol)
  for got, ref in zip(grads, want_grads):
    np.testing.assert_allclose(got, np.asarray(ref), atol=tol * 5, rtol=tol * 5)


@pytest.mark.parametrize("impl", [Impl.XLA, Impl.PALLAS])
def test_bfloat16_attention_stays_within_bfloat16_rounding(impl):
  qkv, masks = _inputs("causal, grouped-query")
  out = attention.attend(*(jnp.asarray(x, jnp.bfloat16) for x in qkv), implementation=impl,
                         **masks)
  assert out.dtype == jnp.bfloat16
  with jax.enable_x64(True):
    want = np.asarray(reference(*(jnp.asarray(x, jnp.float64) for x in qkv), masks))
  np.testing.assert_allclose(np.asarray(out, np.float64), want, atol=3e-2, rtol=3e-2)


def test_the_tpu_kernels_under_shard_map_split_rows_and_heads_over_the_mesh():
  # data=4 x model=2 on the 8 test devices: each device runs the kernel on its row and its
  # key/value head (with the two query heads that share it); values and gradients are XLA's.
  mesh = mesh_lib.make_mesh({"data": 4, "model": 2})
  qkv, masks = _inputs("causal, grouped-query", copies=2)
  masks.update(q_segments_BL=np.concatenate([SEGMENTS] * 2),
               kv_segments_BS=np.concatenate([SEGMENTS] * 2))
  _, real = _allowed(qkv[0], qkv[1], masks)
  out_x, grads_x = _value_and_grads(Impl.XLA, qkv, masks, real, jnp.float32, mesh)
  out_p, grads_p = _value_and_grads(Impl.PALLAS, qkv, masks, real, jnp.float32, mesh)
  np.testing.assert_allclose(out_p[real], out_x[real], atol=2e-5)
  for a, b in zip(grads_p, grads_x):
    np.testing.assert_allclose(a, b, atol=1e-4)


def test_xla_drops_probabilities_out_as_the_workload_says():
  # A workload's own dropout (`apply`, flax's nn.Dropout in workloads/common/transformer.py)
  # is what XLA applies; the kernels (test_attention_dropout.py) draw from the key.
  qkv, masks = _inputs("padding")
  args = [jnp.asarray(x, jnp.float32) for x in qkv]
  keep = lambda key: attention.Dropout(  # noqa: E731
      0.5, jax.random.key(0),
      apply=lambda p: jnp.where(jax.random.bernoulli(key, 0.5, p.shape), p / 0.5, 0))
  one, two = (attention.attend(*args, dropout=keep(jax.random.key(s)), **masks) for s in (0, 1))
  assert not np.allclose(one, two)


def _site(**kw) -> attention.Site:
  base = dict(name="self-attention", batch=8, q_len=512, kv_len=512, heads=16, kv_heads=16,
              head_dim=64, dtype="bfloat16")
  return attention.Site(**{**base, **kw})


@pytest.mark.parametrize("platform, site, stages, want, why", [
    ("cpu", _site(), 1, Impl.XLA, "no fused attention kernel on cpu"),
    ("gpu", _site(), 1, Impl.CUDNN, "cuDNN"),
    ("gpu", _site(dtype="float32"), 1, Impl.XLA, "float32; cuDNN needs bfloat16"),
    ("gpu", _site(head_dim=264), 1, Impl.XLA, "multiple of 8, but got 264"),
    ("gpu", _site(q_len=1), 1, Impl.XLA, "decoding"),
    ("gpu", _site(dropout=0.1), 1, Impl.XLA,
     "attention dropout 0.1 in training: cuDNN's dropout seed is a Python int"),
    ("tpu", _site(causal=True), 1, Impl.PALLAS, "splash"),
    ("tpu", _site(bias=True), 1, Impl.PALLAS, "flash attention (with the bias)"),
    ("tpu", _site(q_len=196, kv_len=196), 1, Impl.XLA, "196 x 196 tokens"),
    ("tpu", _site(), 4, Impl.XLA, "pipeline stages"),
    ("tpu", _site(dropout=0.1, padding=True, packed=True), 1, Impl.PALLAS,
     "Pallas fused attention with the dropout in the kernel"),
    ("tpu", _site(dropout=0.1, causal=True, heads=32, kv_heads=8), 1, Impl.PALLAS, "dropout"),
    ("tpu", _site(dropout=0.1, bias=True), 1, Impl.XLA, "dropout 0.1 with a bias"),
    ("tpu", _site(dropout=0.1, q_len=4096, kv_len=4096), 1, Impl.XLA,
     "holds a row's keys whole in VMEM"),
    ("tpu", _site(dropout=0.1), 4, Impl.XLA, "pipeline stages"),
])
def test_auto_picks_the_platforms_kernel_where_it_can_serve_the_shape(platform, site, stages,
                                                                      want, why):
  choice = attention.choose(Impl.AUTO, platform, site, stages=stages)
  assert choice.implementation is want and why in choice.reason, choice


@pytest.mark.parametrize("requested, platform, site, why", [
    (Impl.CUDNN, "cpu", _site(), "cuDNN runs on NVIDIA GPUs"),
    (Impl.CUDNN, "tpu", _site(), "cuDNN runs on NVIDIA GPUs"),
    (Impl.PALLAS, "gpu", _site(), "TPU kernels"),
    (Impl.PALLAS, "tpu", _site(q_len=100, kv_len=100), "multiples of 128"),
    (Impl.CUDNN, "gpu", _site(dropout=0.1), "dropout 0.1"),
])
def test_a_forced_kernel_that_cannot_serve_the_shape_is_a_one_line_error(requested, platform,
                                                                         site, why):
  with pytest.raises(UserError) as err:
    attention.choose(requested, platform, site)
  message = str(err.value)
  assert "\n" not in message and why in message
  assert f"model.attention={requested.value}" in message and "set model.attention=auto" in message


def test_forced_choices_that_can_serve_say_so():
  assert attention.choose(Impl.XLA, "tpu", _site()).implementation is Impl.XLA
  on_cpu = attention.choose(Impl.PALLAS, "cpu", _site())
  assert on_cpu.implementation is Impl.PALLAS and "interpreter" in on_cpu.reason


def test_recording_counts_each_programs_calls_by_kind():
  q = jnp.zeros((1, 128, 2, 8))
  with attention.recording() as used:
    with attention.program("train step"):
      jax.eval_shape(lambda x: [attention.attend(x, x, x, causal=True) for _ in range(3)], q)
    with attention.program("eval step"):
      jax.eval_shape(lambda x: attention.attend(x, x, x, name="cross-attention"), q)
  assert [(u.program, u.site.name, u.calls) for u in used] == [
      ("train step", "attention", 3), ("eval step", "cross-attention", 1)]
  assert used[0].line().startswith("train step: attention, 128 x 128 tokens, 2 heads of 8, "
                                   "float32, causal: xla - no fused attention kernel")



@pytest.mark.parametrize("site, why", [
    # BoT50's 7x7 maps with the relative logits as a bias: 49 tokens, odd.
    (_site(q_len=49, kv_len=49, bias=True, bias_dtype="float32"),
     "jax's cuDNN check refuses it in training: Unsupported sequence length Q 49, KV 49."),
    (_site(q_len=48, kv_len=49, packed=True), "Unsupported sequence length Q 48, KV 49."),
    (_site(bias=True, bias_dtype="float16"), "a float16 bias; cuDNN takes one in float32 or "
                                             "the inputs' bfloat16"),
    (_site(q_len=49, kv_len=49, bias=True, bias_dtype="bfloat16", training=False), ""),
    (_site(q_len=48, kv_len=48, bias=True, bias_dtype="float32"), ""),
    (_site(q_len=49, kv_len=49, causal=True, padding=True), ""),  # no bias: odd is fine
])
def test_the_cudnn_choice_is_what_the_installed_jax_accepts(site, why):
  """The choice asks jax's own cuDNN checks (jax/_src/cudnn/fused_attention_stablehlo.py),
  which run without a GPU: what they would raise while tracing is XLA with their reason."""
  choice = attention.choose(Impl.AUTO, "gpu", site)
  if why:
    assert choice.implementation is Impl.XLA and choice.reason.endswith(why), choice
  else:
    assert choice.implementation is Impl.CUDNN, choice


@pytest.mark.skipif(_gpu(), reason="on a GPU jax answers for its generation")
def test_off_a_gpu_jax_answers_for_the_head_sizes_of_a_gpu_before_hopper():
  choice = attention.choose(Impl.AUTO, "gpu", _site(head_dim=192))
  assert choice.implementation is Impl.XLA
  assert choice.reason.endswith("The head dim must be <= 128 and a multiple of 8, but got 192.")


def test_bot50_on_a_gpu_trains_its_attention_on_xla_and_says_why():
  """BoT50's own attention calls, traced as its train and eval steps trace them (bfloat16,
  as on a GPU): training adds the relative logits as a bias to 49-token maps, which jax's
  cuDNN refuses; evaluating (no gradient) it takes them."""
  import dataclasses

  from mlbench.fields import DType
  from workloads.resnet50 import bot, config

  # The last stage's second block, as the full config builds it: 7x7 maps of 2,048 channels.
  block = bot.BoTBlock(512, 1, dataclasses.replace(config.full().model, dtype=DType.BFLOAT16))
  x = jax.ShapeDtypeStruct((2, 7, 7, 2048), jnp.bfloat16)
  variables = jax.eval_shape(lambda k, x: block.init(k, x, train=False), jax.random.key(0), x)

  def loss(v, x):
    return block.apply(v, x, train=True, mutable=["batch_stats"])[0].astype(jnp.float32).sum()

  with attention.recording() as used:
    with attention.program("train step"):
      jax.eval_shape(jax.grad(loss), variables, x)
    with attention.program("eval step"):
      jax.eval_shape(lambda v, x: block.apply(v, x, train=False), variables, x)
  on_gpu = {u.program: attention.choose(Impl.AUTO, "gpu", u.site) for u in used}
  site = used[0].site
  assert (site.q_len, site.kv_len, site.head_dim, site.bias, site.dtype) == (
      49, 49, 128, True, "bfloat16")
  assert on_gpu["train step"] == attention.Choice(Impl.XLA, (
      "cudnn cannot serve it: jax's cuDNN check refuses it in training: Unsupported sequence "
      "length Q 49, KV 49."))
  assert on_gpu["eval step"].implementation is Impl.CUDNN
