"""MoE language-model configs: `full` (a GShard-sized MoE for a pod) and `mini` (pydoc, CPU).

Run either with `mlbench run moe --config full|mini`; edit any field with
`--set model.moe.capacity_factor=1.25`. This module imports nothing heavy.
"""

from __future__ import annotations

import dataclasses
import enum

from mlbench.fields import AttentionImpl, DType, WorkloadConfig, at_least, divides, fraction, positive, require
from workloads.common.adamw import AdamWCosine


class Source(enum.Enum):
  """Where the token TFRecords come from."""

  TFRECORDS = "tfrecords"  # Pre-tokenised sequences (`train-*`, `eval-*`), supplied by you.
  PYDOC = "pydoc"          # CPython's pydoc_data.topics, tokenised and written by mlbench.


class SecondExpert(enum.Enum):
  """How top-2 routing dispatches a token's second expert in training."""

  RANDOM = "random"  # with probability min(1, 2 x its normalised gate): GShard's
  ALL = "all"        # always (capacity permitting)


@dataclasses.dataclass(frozen=True)
class MoeConfig:
  """The Mixture-of-Experts feed-forward of every `every`-th layer (GShard: every other).

  Attributes:
    num_experts: E.
    top_k: experts per token: 2 (GShard top-2) or 1 (Switch top-1).
    expert_size: each expert's hidden width.
    capacity_factor: C = ceil(capacity_factor * top_k * tokens / experts) slots
      per expert and sequence in training.
    eval_capacity_factor: the same, in evaluation.
    aux_loss_coeff: weight of GShard's load-balancing loss (logged as
      `moe_aux_loss_coeff`), per MoE layer.
    z_loss_coeff: weight of ST-MoE's router z-loss, per MoE layer.
    every: layers i with i % every == every - 1 are MoE layers (2: layers 1, 3, ...).
    second_expert: GShard's random dispatch of the second expert in training, or
      always; evaluation always dispatches it (it has no random key).
  """

  num_experts: int = 64
  top_k: int = 2
  expert_size: int = 8192
  capacity_factor: float = 1.0
  eval_capacity_factor: float = 2.0
  aux_loss_coeff: float = 1e-2
  z_loss_coeff: float = 1e-3
  every: int = 2
  second_expert: SecondExpert = SecondExpert.RANDOM

  def __post_init__(self):
    at_least(self, 1, "num_experts", "expert_size", "every")
    require(self.top_k in (1, 2) and self.top_k <= self.num_experts, "top_k",
            f"{self.top_k} is not 1 or 2 (at most num_experts, {self.num_experts})",
            "num_experts")
    positive(self, "capacity_factor", "eval_capacity_factor")
    at_least(self, 0, "aux_loss_coeff", "z_loss_coeff")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """A decoder-only, pre-LayerNorm Transformer LM with sinusoidal positions and a tied
  output embedding; dense layers use the shared `Mlp`, MoE layers the MoE feed-forward.

  The defaults are a GShard-sized model (the MoE(64E) family of Lepikhin et al.
  2020 at width 1024): 24 layers, 12 of them with 64 experts of width 8192.
  """

  vocab_size: int = 32_000
  width: int = 1024
  num_layers: int = 24
  num_heads: int = 16
  mlp_size: int = 8192       # the dense layers' feed-forward width
  moe: MoeConfig = MoeConfig()
  dropout: float = 0.0
  dtype: DType = DType.BFLOAT16  # activations and matmuls; parameters and router stay float32
  # Which implementation computes attention (mlbench.train.attention): auto picks the fused
  # kernel the platform has where it can serve the shape (cuDNN on GPUs, Pallas on TPUs).
  attention: AttentionImpl = AttentionImpl.AUTO
  # Groups of `moe.every` layers as one scanned stack (parameters under `layers/layer/...`,
  # stacked on a leading axis; num_layers a multiple of every): pipeline stages split it.
  scan_layers: bool = False

  def __post_init__(self):
    at_least(self, 1, "vocab_size", "width", "num_layers", "mlp_size")
    divides(self, "num_heads", "width")
    fraction(self, "dropout")
    require(not self.scan_layers or self.num_layers % self.moe.every == 0, "scan_layers",
            f"needs num_layers ({self.num_layers}) to be a multiple of moe.every "
            f"({self.moe.every}), the layers of one scanned group", "num_layers", "moe.every")


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Fixed-length token sequences: `tokens` holds seq_length + 1 ids (inputs and the
  next-token targets, shifted by one)."""

  source: Source = Source.TFRECORDS
  seq_length: int = 1024
  train_examples: int = 0    # 0: no epochs; train_samples is logged as the budget
  eval_examples: int = 1024

  def __post_init__(self):
    at_least(self, 1, "seq_length", "eval_examples")
    at_least(self, 0, "train_examples")


@dataclasses.dataclass(frozen=True)
class MoeLMConfig(WorkloadConfig[ModelConfig, DataConfig, AdamWCosine]):
  name: str = "full"         # logged as config_filename


def full() -> MoeLMConfig:
  """A GShard-sized top-2 MoE LM: 24 layers of width 1024 (16 heads), the dense layers'
  feed-forward 8192 wide, every other layer 64 experts of width 8192 (13.2 B
  parameters, 0.74 B active per token), sequences of 1024 tokens, batch 1024
  (1 M tokens, one sequence per device on a data=16,expert=64 mesh), capacity
  factor 1 (GShard's 2N/E slots for top-2), bfloat16 activations. Expects
  pre-tokenised TFRecords in --data-dir; meant for
  `mlbench check moe --config full --mesh data=16,expert=64`.
  """
  return MoeLMConfig(
      model=ModelConfig(),
      data=DataConfig(),
      # The optimizer of the MLPerf 6.x MoE benchmarks.
      optimizer=AdamWCosine(base_learning_rate=4e-4, end_learning_rate=4e-5, warmup_steps=1000,
                            max_steps=100_000),
      global_batch_size=1024,
      eval_batch_size=1024,
  )


def mini() -> MoeLMConfig:
  """A 2-layer, 128-wide causal LM (layer 1 with 4 experts, top-2, capacity factor
  1.25) on the Python reference manual's help texts (`pydoc_data.topics`), with its
  own 1,024-token byte-level BPE vocabulary, sequences of 64 tokens, dropout 0.1
  (the corpus is small: 0.12 M training tokens). Reaches the mini target (held-out
  log perplexity 3.75, perplexity 43; a unigram model scores 6.0) after about 350
  steps of 32 sequences, about a minute on a 2-core CPU.
  """
  return MoeLMConfig(
      name="mini",
      model=ModelConfig(vocab_size=1024, width=128, num_layers=2, num_heads=4, mlp_size=512,
                        moe=MoeConfig(num_experts=4, top_k=2, expert_size=512,
                                      capacity_factor=1.25, eval_capacity_factor=2.0),
                        dropout=0.1, dtype=DType.FLOAT32),
      data=DataConfig(source=Source.PYDOC, seq_length=64, train_examples=16384,
                      eval_examples=192),
      optimizer=AdamWCosine(base_learning_rate=5e-3, end_learning_rate=5e-4, warmup_steps=50,
                            max_steps=1000),
      global_batch_size=32,
      eval_batch_size=64,
  )
