"""Model FLOP counts, the numerator of every MFU mlbench reports.

Each built-in workload's analytic `flops_per_example` is checked against an
independent count of the program its loss really runs (every matmul and
convolution in the traced jaxpr, from their shapes), against hand derivations of the
full architectures from their published sizes, and against XLA's count of the
lowered (unoptimised) gradient. Model FLOPs are the multiply-adds of those
layers, 2 FLOPs each, times 3 for forward and backward.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
import pytest

from mlbench import config as config_lib, registry
from mlbench.train import steps
from mlbench.workload import Split, StepContext

BUILT_IN = ("resnet50", "ssd", "bert", "transformer", "moe", "llama31_8b", "efficientnet", "vit")
# Every matmul these run is model work (the MoE also runs its dispatch and combine einsums).
EXACT = ("resnet50", "ssd", "bert", "transformer", "llama31_8b", "efficientnet", "vit")


def _eqn_macs(eqn) -> float:
  """Multiply-adds of one matmul or convolution of a jaxpr, from its shapes."""
  out = eqn.outvars[0].aval.shape
  if eqn.primitive.name == "dot_general":
    (lhs_contract, _), _ = eqn.params["dimension_numbers"]
    lhs = eqn.invars[0].aval.shape
    return math.prod(out) * math.prod(lhs[d] for d in lhs_contract)
  if eqn.primitive.name == "conv_general_dilated":  # each output sees the whole kernel
    rhs = eqn.invars[1].aval.shape
    kernel_spec = eqn.params["dimension_numbers"].rhs_spec  # (out, in, *spatial)
    taps = math.prod(rhs[d] for d in kernel_spec[2:])
    return math.prod(out) * taps * rhs[kernel_spec[1]]
  return 0.0


def jaxpr_macs(jaxpr) -> float:
  """Multiply-adds of every matmul and convolution a jaxpr runs: sub-programs (jit,
  checkpoint, custom derivatives) once, a scan's body once per iteration."""
  total = 0.0
  for eqn in jaxpr.eqns:
    total += _eqn_macs(eqn)
    times = eqn.params["length"] if eqn.primitive.name == "scan" else 1
    if eqn.primitive.name == "while":
      raise AssertionError("a while loop's trip count is unknown; count it by hand")
    for value in eqn.params.values():
      for sub in (value if isinstance(value, (tuple, list)) else (value,)):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          total += times * jaxpr_macs(inner)
  return total


def traced_forward_macs(workload, cfg) -> float:
  """Multiply-adds of one example's forward pass: every matmul and convolution in
  the program of the workload's loss (traced from shapes, not run)."""
  params, state = jax.eval_shape(lambda k: workload.init(cfg, k), jax.random.key(0))
  one = workload.synthetic_batch(cfg, Split.TRAIN, 1, np.random.default_rng(0))
  closed = jax.make_jaxpr(lambda p, s, b: workload.loss(cfg, StepContext(mesh=None), p, s, b,
                                                        jax.random.key(0)))(params, state, one)
  return jaxpr_macs(closed.jaxpr)


def _config(name: str, config: str):
  return registry.get(name).configs[config]()


def test_every_built_in_workload_counts_its_flops_from_its_architecture():
  for name in BUILT_IN:
    w = registry.get(name)
    assert w.flops_per_example is not None, name
    for config in w.configs:
      assert w.flops_per_example(w.configs[config]()) > 0, (name, config)


@pytest.mark.parametrize("config", ["mini", "full"])
@pytest.mark.parametrize("name", EXACT)
def test_the_count_equals_the_layers_the_loss_calls(name, config):
  w = registry.get(name)
  cfg = _config(name, config)
  traced = 6 * traced_forward_macs(w, cfg)
  assert w.flops_per_example(cfg) == pytest.approx(traced, rel=1e-12)


def test_hand_derivations_of_the_full_architectures():
  def flops(name):
    return registry.get(name).flops_per_example(_config(name, "full"))

  # ResNet-50 v1.5 at 224x224: 4.089 GMAC forward (torchvision's ResNet50_Weights
  # IMAGENET1K_V2 lists 4.089 G multiply-adds for the same architecture).
  assert flops("resnet50") / 6 == pytest.approx(4.089e9, rel=2e-4)
  # BERT-large at sequence 512: per layer four H x H projections and the H x 4H
  # MLP at 512 positions plus scores and weighted values (512^2 x H each); the
  # masked-LM transform and tied output projection at the 76 masked positions; the
  # pooler and next-sentence head at one.
  s, h, f = 512, 1024, 4096
  layer = 4 * s * h * h + 2 * s * s * h + 2 * s * h * f
  assert flops("bert") == 6 * (24 * layer + 76 * h * (h + 30522) + h * (h + 2))
  # Transformer-big, 256 source and 256 target tokens: 6 encoder layers (self-
  # attention, MLP), 6 decoder layers (self- and cross-attention, MLP), the shared
  # 33,708-entry embedding as output projection.
  n = 256
  attention = 4 * n * h * h + 2 * n * n * h
  mlp = 2 * n * h * f
  assert flops("transformer") == 6 * (6 * (attention + mlp) + 6 * (2 * attention + mlp)
                                      + n * h * 33708)
  # Llama 3.1 8B at 8,192 tokens: 6 N D over the 7,504,658,432 parameters that multiply
  # (Meta's 8,030,261,248 less the 128,256 x 4,096 input embedding and the 65 RMSNorm
  # scales), plus causal attention counted in full, 4 x 8192^2 x 4096 per layer forward.
  d = 8192
  assert 8_030_261_248 - 128_256 * 4096 - 65 * 4096 == 7_504_658_432
  assert flops("llama31_8b") == 6 * 7_504_658_432 * d + 3 * 32 * 4 * d * d * 4096


def test_hand_derivations_of_the_vision_papers_models():
  def forward_macs(name, *overrides):
    w = registry.get(name)
    return w.flops_per_example(config_lib.override(_config(name, "full"), overrides)) / 6

  # EfficientNet (Tan & Le 2019, Table 2): B0 0.39 B and B5 9.9 B multiply-adds; the
  # published counts are rounded and leave out a few percent at the larger resolutions.
  assert forward_macs("efficientnet", "model.variant=b0") == pytest.approx(0.39e9, rel=0.02)
  assert forward_macs("efficientnet") == pytest.approx(9.9e9, rel=0.05)
  # ViT-S/16 at 224: 196 patches of 16x16x3 -> 384; 12 blocks of four 384x384
  # projections, scores and weighted values (196^2 x 384 each) and the 384x1536 MLP;
  # the 384x384 pre-logits and the 384x1000 head on the pooled token (4.6 GFLOPs in
  # DeiT's table).
  n, d, f = 196, 384, 1536
  vit = n * 768 * d + 12 * (4 * n * d * d + 2 * n * n * d + 2 * n * d * f) + d * d + d * 1000
  assert forward_macs("vit") == vit and vit == pytest.approx(4.6e9, rel=0.01)
  # BoT50: ResNet-50's count with the last stage's three 3x3x512x512 convolutions (one at
  # 7x7 outputs after the stride, two at 7x7) replaced by self-attention over 14x14 (the
  # first block, before its pooling) and 7x7 positions: q, k, v projections, q.k and
  # the weighted values, and the row and column relative logits.
  def mhsa(side, c=512):
    p = side * side
    return 3 * p * c * c + 2 * p * p * c + 2 * p * side * c

  resnet = forward_macs("resnet50")
  bot = resnet - 3 * 49 * 9 * 512 * 512 + mhsa(14) + 2 * mhsa(7)
  assert forward_macs("resnet50", "model.block=bottleneck_transformer") == bot


@pytest.mark.parametrize("name", ["resnet50", "ssd"])
def test_the_space_to_depth_stem_counts_the_model_not_its_zero_taps(name):
  # model.stem=space_to_depth runs the 7x7x3 kernel as 4x4x12 (8x8 taps, 15 of them zero per
  # input channel); model FLOPs stay the 7x7 convolution's, so MFU compares across stems.
  w = registry.get(name)
  plain, s2d = (config_lib.override(_config(name, "full"), (f"model.stem={stem}",))
                for stem in ("imagenet", "space_to_depth"))
  assert w.flops_per_example(s2d) == w.flops_per_example(plain)
  out = s2d.data.image_size // 2
  width = s2d.model.width if name == "resnet50" else s2d.model.stage_widths[0]
  zero_taps = out * out * (8 * 8 - 7 * 7) * 3 * width
  assert traced_forward_macs(w, s2d) == traced_forward_macs(w, plain) + zero_taps


@pytest.mark.parametrize("config", ["mini", "full"])
def test_bot50_counts_the_layers_its_loss_calls_and_xla_agrees(config):
  w = registry.get("resnet50")
  cfg = config_lib.override(_config("resnet50", config), ("model.block=bottleneck_transformer",))
  assert w.flops_per_example(cfg) == pytest.approx(6 * traced_forward_macs(w, cfg), rel=1e-12)
  assert 0.95 <= _lowered("resnet50", cfg) / w.flops_per_example(cfg) <= 1.02


def _lowered(name: str, cfg) -> float:
  w = registry.get(name)
  return steps.flops_per_example(dataclasses.replace(w, flops_per_example=None), cfg,
                                 StepContext(mesh=None))


def _small_full(name: str):
  """The full config, cut where lowering it whole would be slow (layers, length) or
  where XLA's count is known to mislead: a loop's body (a scanned layer stack, the
  Transformer's loss over slices of 32 positions) is counted once, rematerialisation
  counts the recomputed forward again, and capacity slots left empty by the router
  are still multiplied."""
  cfg = _config(name, "full")
  m = cfg.model
  if name == "bert":
    return dataclasses.replace(cfg, model=dataclasses.replace(m, num_layers=2))
  if name == "transformer":  # one slice of the loss
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, max_length=32))
  if name == "moe":
    m = dataclasses.replace(m, num_layers=2, moe=dataclasses.replace(m.moe, capacity_factor=1.0))
    return dataclasses.replace(cfg, model=m, data=dataclasses.replace(
        cfg.data, seq_length=min(cfg.data.seq_length, 256)))
  if name == "efficientnet":  # B5 at 456x456 lowers in a minute; B0 is the same code
    return config_lib.override(cfg, ("model.variant=b0",))
  if name == "vit":
    return config_lib.override(cfg, ("model.depth=2",))
  if name == "llama31_8b":
    from workloads.llama31_8b.config import Remat

    m = dataclasses.replace(m, num_layers=2, remat=Remat.NONE, scan_layers=False,
                            attention_chunk=0)
    return dataclasses.replace(cfg, model=m, data=dataclasses.replace(cfg.data, seq_length=1024))
  return cfg


# XLA's count of the lowered gradient over the analytic count. Convolutions: XLA
# leaves out the kernel taps that fall on padding (many on the minis' 2x2 to 8x8
# maps) and the image's own gradient, which training never computes. Transformers:
# XLA adds the softmaxes, norms and activations; the MoE also its dispatch and
# combine einsums, which are routing, not model FLOPs. EfficientNet: its batch norms,
# swishes and squeeze-excite products are as many FLOPs as its depthwise convolutions
# in the narrow mini (1.29), 4% at B0 and B5. ViT: as convolutions, no gradient of the
# image through the patch embedding (1.5% of the 2-layer cut), and its softmaxes and norms.
LOWERED_OVER_ANALYTIC = {"resnet50": (0.95, 1.02), "ssd": (0.85, 1.0), "bert": (1.0, 1.03),
                         "transformer": (1.0, 1.02), "moe": (1.0, 1.1),
                         "llama31_8b": (1.0, 1.02), "efficientnet": (1.0, 1.35),
                         "vit": (0.98, 1.05)}


@pytest.mark.parametrize("config", ["mini", "full"])
@pytest.mark.parametrize("name", BUILT_IN)
def test_the_count_agrees_with_xlas_count_of_the_lowered_gradient(name, config):
  cfg = _small_full(name) if config == "full" else _config(name, config)
  if name == "moe" and config == "mini":
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(
        cfg.model, moe=dataclasses.replace(cfg.model.moe, capacity_factor=1.0)))
  low, high = LOWERED_OVER_ANALYTIC[name]
  assert low <= _lowered(name, cfg) / registry.get(name).flops_per_example(cfg) <= high
