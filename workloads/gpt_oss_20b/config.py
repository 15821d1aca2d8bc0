"""GPT-OSS 20B configs: `full` (the MLPerf Training 6.x gpt_oss_20b reference, AMD's Primus on
Megatron-LM) and `mini` (a small GPT-OSS on CPython's own documentation, CPU).

Run either with `mlbench run gpt_oss_20b --config full|mini`; edit any field with
`--set model.window=0`. Sources of every full-config value: the workload's README.md
(`mlbench describe gpt_oss_20b --config full`). This module imports nothing heavy.
"""

from __future__ import annotations

import dataclasses
import enum

from mlbench.fields import (AttentionImpl, DType, Remat, WorkloadConfig, at_least, divides,
                            positive, require)
from workloads.common.adamw import AdamWCosine


class Source(enum.Enum):
  """Where the Megatron indexed datasets (`.bin` + `.idx`) come from."""

  C4 = "c4"          # The reference's preprocessed C4, llama31_8b's files (supplied by you).
  PYDOC = "pydoc"    # CPython's docstrings and pydoc_data help texts, written by mlbench.


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """A GPT-OSS decoder (Megatron-core GPTModel as the reference configures it): pre-RMSNorm
  blocks of grouped-query attention (RMSNorm on each query and key head, rotary embeddings)
  and a dropless Mixture of Experts in every layer (top_k of num_experts SwiGLU experts,
  chosen on the router's logits, weighted by a softmax over the chosen); layers alternate
  sliding-window and full causal attention; untied embeddings; no biases, no attention
  sinks, no shared expert, no auxiliary loss.

  The defaults are the reference's: 24 layers of width 2,880, 64 query heads and 8
  key/value heads of 64 (queries 4,096 wide), 32 experts of width 2,880, top-4, RoPE theta
  150,000, RMSNorm epsilon 1e-6, init std 0.008, the Llama 3.1 vocabulary (128,256).

  Attributes:
    window: the sliding window, Transformer Engine's `window_size` (window, 0): query i
      sees keys i - window ... i, window + 1 of them; 0: every layer full causal.
    window_skip_freq: Megatron's `window_attn_skip_freq` as an integer N: 1-based layer n
      slides where n % N != 0, so N = 2 is the reference's list [1, 0, 1, 0, ...] (layers
      1, 3, ... slide, 2, 4, ... see everything; 0-based: even layers slide).
    scan_layers: groups of `window_skip_freq` layers (the pattern's period) as one scanned
      stack, parameters under `layers/group/...` on a leading axis: what pipeline stages
      split.
  """

  vocab_size: int = 128_256
  width: int = 2880
  num_layers: int = 24
  num_heads: int = 64
  num_kv_heads: int = 8
  head_dim: int = 64
  num_experts: int = 32
  top_k: int = 4
  expert_size: int = 2880
  window: int = 128
  window_skip_freq: int = 2
  rope_theta: float = 150_000.0
  norm_epsilon: float = 1e-6
  init_std: float = 0.008          # Megatron's init_method_std; output projections / sqrt(2L)
  dtype: DType = DType.BFLOAT16    # activations and matmuls; parameters and router float32
  # Which implementation computes attention (mlbench.train.attention): auto picks the fused
  # kernel the platform has where it can serve the shape (cuDNN on GPUs, Pallas on TPUs).
  attention: AttentionImpl = AttentionImpl.AUTO
  remat: Remat = Remat.FULL
  # Where attention runs on XLA (CPUs; `attention=xla`): 0, one attention per layer, all
  # L x L scores at once (masked to the window in sliding layers); N > 0, queries in blocks
  # of N, each attending under its own rematerialisation to the keys up to its end (in a
  # sliding layer only from the window's start), one block's scores at a time. The fused
  # kernels never hold the scores and ignore it.
  attention_chunk: int = 0
  scan_layers: bool = False

  def __post_init__(self):
    at_least(self, 1, "vocab_size", "width", "num_layers", "num_heads", "head_dim",
             "num_experts", "expert_size", "window_skip_freq")
    divides(self, "num_kv_heads", "num_heads")
    require(self.head_dim % 2 == 0, "head_dim", f"{self.head_dim} is odd; rotary embeddings "
            "rotate pairs of channels, so set an even head_dim")
    require(1 <= self.top_k <= self.num_experts, "top_k",
            f"{self.top_k} is not between 1 and num_experts ({self.num_experts})", "num_experts")
    at_least(self, 0, "window", "attention_chunk")
    positive(self, "rope_theta", "norm_epsilon", "init_std")
    require(not self.scan_layers or self.num_layers % self.window_skip_freq == 0, "scan_layers",
            f"needs num_layers ({self.num_layers}) to be a multiple of window_skip_freq "
            f"({self.window_skip_freq}), the layers of one scanned group", "num_layers",
            "window_skip_freq")

  def sliding(self, layer: int) -> bool:
    """Whether 0-based `layer` attends through the sliding window (Megatron-core
    is_layer_window_attention, 1-based layer numbers)."""
    return self.window > 0 and (layer + 1) % self.window_skip_freq != 0


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Samples of seq_length + 1 tokens over concatenated documents, built from Megatron
  indexed datasets as Megatron's GPTDataset builds them (`workloads/common/gpt_samples.py`):
  training samples shuffled with the run's seed, the evaluation set the first
  `eval_examples` of the validation split shuffled the same way.

  Attributes:
    train_prefix, eval_prefix: file prefixes (without `.bin`/`.idx`) under --data-dir.
    eod_token: the tokenizer's end-of-document id; positions whose input is it are left
      out of the loss (Megatron's eod_mask_loss). Llama 3.1's `<|end_of_text|>`; the
      reference's C4 holds none (tokenised without --append-eod), the mini corpus one
      after every document.
  """

  source: Source = Source.C4
  seq_length: int = 8192
  train_prefix: str = "c4-train.en_6_text_document"
  eval_prefix: str = "c4-validation-91205-samples.en_text_document"
  eval_examples: int = 1024
  eod_token: int = 128_001

  def __post_init__(self):
    at_least(self, 1, "seq_length", "eval_examples")
    at_least(self, 0, "eod_token")


@dataclasses.dataclass(frozen=True)
class GptOssConfig(WorkloadConfig[ModelConfig, DataConfig, AdamWCosine]):
  name: str = "full"                    # logged as config_filename
  gradient_accumulation_steps: int = 1  # the global batch is this many sequential microbatches
  train_budget_steps: int = 0           # steps a run may take before it gives up; 0: max_steps

  def __post_init__(self):
    super().__post_init__()
    at_least(self, 1, "gradient_accumulation_steps")
    at_least(self, 0, "train_budget_steps")
    require(self.data.eod_token < self.model.vocab_size, "data.eod_token",
            f"{self.data.eod_token} is not an id of the {self.model.vocab_size}-token vocabulary",
            "model.vocab_size")
    chunk, length = self.model.attention_chunk, self.data.seq_length
    require(chunk == 0 or chunk >= length or length % chunk == 0, "model.attention_chunk",
            f"{chunk} does not divide data.seq_length ({length}); set 0 (one attention call) "
            f"or a divisor of {length}")


def full() -> GptOssConfig:
  """GPT-OSS 20B on the reference's C4 (llama31_8b's Megatron files), sequences of 8,192
  tokens, batch 16 at learning rate 4e-4 (the reference's and its batch-16 convergence
  points'), 128 warmup steps, cosine to 4e-5 over 1.2 M - 128 steps, bfloat16, scanned
  pairs of layers (sliding, full) with full remat. A run gives up after 43,008 steps
  (688 k sequences, 3.5x the batch-16 convergence points' mean of 196 k)."""
  return GptOssConfig(
      model=ModelConfig(scan_layers=True),
      data=DataConfig(),
      optimizer=AdamWCosine(base_learning_rate=4e-4, end_learning_rate=4e-5, warmup_steps=128,
                            max_steps=1_200_000),
      global_batch_size=16,
      eval_batch_size=16,
      train_budget_steps=43_008,
  )


def mini() -> GptOssConfig:
  """A 2-layer, 128-wide GPT-OSS (layer 0 sliding over 32 keys back, layer 1 full; 4 query
  and 2 key/value heads of 32; 4 experts of width 128, top-2) on CPython's docstrings and
  pydoc help texts with their 1,024-token byte-level BPE (llama31_8b's mini corpus; its
  end-of-document token, id 0, masked), sequences of 256 tokens, batch 8, learning rate
  1e-2. Reaches the mini target (held-out log perplexity 5.4; a unigram model scores 5.94)
  after 80 steps: about 30 s of training and 50 s of compiling on a loaded 2-core CPU."""
  return GptOssConfig(
      name="mini",
      model=ModelConfig(vocab_size=1024, width=128, num_layers=2, num_heads=4, num_kv_heads=2,
                        head_dim=32, num_experts=4, top_k=2, expert_size=128, window=32,
                        rope_theta=10_000.0, init_std=0.02, dtype=DType.FLOAT32,
                        remat=Remat.NONE),
      data=DataConfig(source=Source.PYDOC, seq_length=256, train_prefix="train_text_document",
                      eval_prefix="validation_text_document", eval_examples=64, eod_token=0),
      optimizer=AdamWCosine(base_learning_rate=1e-2, end_learning_rate=1e-3, warmup_steps=20,
                            max_steps=1000),
      global_batch_size=8,
      eval_batch_size=32,
  )
