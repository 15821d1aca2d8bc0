"""Llama 3.1 8B configs: `full` (the MLPerf Training 6.0 llama31_8b reference) and `mini`
(a small Llama on CPython's own documentation, CPU).

Run either with `mlbench run llama31_8b --config full|mini`; edit any field with
`--set model.remat=none`. This module imports nothing heavy.
"""

from __future__ import annotations

import dataclasses
import enum

from mlbench.fields import AttentionImpl, DType, Remat, WorkloadConfig, at_least, divides, positive, require
from workloads.common.adamw import AdamWCosine


class Source(enum.Enum):
  """Where the Megatron indexed datasets (`.bin` + `.idx`) come from."""

  C4 = "c4"          # The reference's preprocessed C4 (supplied by you, see input_pipeline).
  PYDOC = "pydoc"    # CPython's docstrings and pydoc_data help texts, written by mlbench.


@dataclasses.dataclass(frozen=True)
class RopeConfig:
  """Rotary position embeddings with Llama 3.1's frequency scaling (Meta's
  `apply_scaling`: wavelengths beyond `original_context / low_freq_factor` are
  stretched by `factor`, those below `original_context / high_freq_factor` kept,
  the band between interpolated)."""

  theta: float = 500_000.0
  factor: float = 8.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_context: int = 8192
  scaled: bool = True

  def __post_init__(self):
    positive(self, "theta", "factor", "low_freq_factor")
    require(self.high_freq_factor > self.low_freq_factor, "high_freq_factor",
            f"{self.high_freq_factor} is not above low_freq_factor ({self.low_freq_factor}), "
            "which the scaling interpolates between", "low_freq_factor")
    at_least(self, 1, "original_context")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """A Llama-3.1-style decoder: pre-RMSNorm blocks, grouped-query attention with rotary
  embeddings, a SwiGLU MLP, untied input and output embeddings, no biases.

  The defaults are Llama 3.1 8B (Llama 3 herd paper, table 3; NeMo's Llama31Config8B):
  32 layers of width 4,096, MLP 14,336, 32 query and 8 key/value heads, a vocabulary
  of 128,256 (the Llama 3 tokenizer's 128,000 plus 256 special tokens).
  """

  vocab_size: int = 128_256
  width: int = 4096
  num_layers: int = 32
  num_heads: int = 32
  num_kv_heads: int = 8
  mlp_size: int = 14_336
  rope: RopeConfig = RopeConfig()
  norm_epsilon: float = 1e-5
  init_std: float = 0.02           # Megatron's init_method_std; output projections / sqrt(2L)
  dtype: DType = DType.BFLOAT16    # activations and matmuls; parameters stay float32
  # Which implementation computes attention (mlbench.train.attention): auto picks the fused
  # kernel the platform has where it can serve the shape (cuDNN on GPUs, Pallas on TPUs).
  attention: AttentionImpl = AttentionImpl.AUTO
  remat: Remat = Remat.FULL
  # Where attention runs on XLA (CPUs; `attention=xla`): 0, one causal attention per layer,
  # all L x L scores at once; N > 0, queries in blocks of N, each attending to the keys up
  # to its end under its own rematerialisation, one block's scores at a time. The fused
  # kernels (cuDNN, Pallas) never hold the scores and ignore it.
  attention_chunk: int = 0
  # One scanned layer (parameters stacked on a leading layer axis) instead of unrolled
  # ones: one layer's program to compile, and under remat the loop keeps one layer's
  # input per layer for the backward pass whatever the compiler's schedule.
  scan_layers: bool = False

  def __post_init__(self):
    at_least(self, 1, "vocab_size", "width", "num_layers", "mlp_size")
    divides(self, "num_heads", "width")
    divides(self, "num_kv_heads", "num_heads")
    require(self.head_dim % 2 == 0, "num_heads", f"{self.num_heads} heads make heads of "
            f"{self.head_dim} dimensions, which rotary embeddings need to be even; set a "
            f"divisor of width ({self.width}) that leaves an even quotient", "width")
    positive(self, "norm_epsilon", "init_std")
    at_least(self, 0, "attention_chunk")

  @property
  def head_dim(self) -> int:
    return self.width // self.num_heads


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Samples of seq_length + 1 tokens over concatenated documents, built from Megatron
  indexed datasets as Megatron's GPTDataset builds them (`workloads/common/gpt_samples.py`).

  Attributes:
    train_prefix: file prefix (without `.bin`/`.idx`) of the training dataset,
      relative to --data-dir; the reference trains on C4 shard 6 (`use_full_dataset`
      off: a blend of that one dataset, which Megatron builds as the dataset itself).
    eval_prefix: the validation dataset; its first `eval_examples` samples, in
      order (the reference does not shuffle them), are the evaluation set.
  """

  source: Source = Source.C4
  seq_length: int = 8192
  train_prefix: str = "c4-train.en_6_text_document"
  eval_prefix: str = "c4-validation-91205-samples.en_text_document"
  eval_examples: int = 1024

  def __post_init__(self):
    at_least(self, 1, "seq_length", "eval_examples")


@dataclasses.dataclass(frozen=True)
class LlamaConfig(WorkloadConfig[ModelConfig, DataConfig, AdamWCosine]):
  name: str = "full"                  # logged as config_filename
  gradient_accumulation_steps: int = 1  # the global batch is this many sequential microbatches
  train_budget_steps: int = 0           # steps a run may take before it gives up; 0: max_steps

  def __post_init__(self):
    super().__post_init__()
    at_least(self, 1, "gradient_accumulation_steps")
    at_least(self, 0, "train_budget_steps")
    chunk, length = self.model.attention_chunk, self.data.seq_length
    require(chunk == 0 or chunk >= length or length % chunk == 0, "model.attention_chunk",
            f"{chunk} does not divide data.seq_length ({length}); set 0 (one attention call) "
            f"or a divisor of {length}")


def full() -> LlamaConfig:
  """Llama 3.1 8B on the reference's C4 (Llama 3.1 tokenizer, Megatron `.bin`/`.idx`),
  sequences of 8,192 tokens, batch 32, the RCP's learning rate 8e-4 with 128 warmup
  steps, bfloat16 activations, scanned layers with full remat. Expects the reference's
  preprocessed files in --data-dir. On 32 chips (`mlbench check llama31_8b --config
  full --cpu-devices 32 --mesh data=8,model=4`, the RCP's 4xDGX-B200 count) a device
  holds 0.94 GiB of parameters and 1.87 GiB of optimizer state; the train step peaks at
  52.8 GiB with one attention call per layer (XLA's unfused attention), 38.4 GiB with
  `--set model.attention_chunk=1024`. A run gives up after 20,000 steps (640 k
  sequences, 3.5x the reference convergence point's 184 k)."""
  return LlamaConfig(
      model=ModelConfig(scan_layers=True),
      data=DataConfig(),
      # Weight decay on kernels and embeddings, none on norm scales (Megatron's parameter
      # groups); min_lr = 0.1 x max_lr (NeMo). The reference convergence points' learning
      # rate for batch 32 (8e-4, 4,096 warmup samples; rcps_llama31_8b.json).
      optimizer=AdamWCosine(base_learning_rate=8e-4, end_learning_rate=8e-5, warmup_steps=128,
                            max_steps=1_200_000),
      global_batch_size=32,
      eval_batch_size=32,
      train_budget_steps=20_000,
  )


def mini() -> LlamaConfig:
  """A 2-layer, 128-wide Llama (4 query and 2 key/value heads of 32, SwiGLU 384) on
  CPython's docstrings and pydoc help texts (0.67 M training tokens), with its own
  1,024-token byte-level BPE, sequences of 256 tokens, batch 8, learning rate 1e-2; a
  held-out tenth of the documents is the validation set (its first 64 samples are
  evaluated; a unigram model scores 5.94 there, uniform guessing 6.93). Reaches the
  mini target (held-out log perplexity 5.4) after about 100 steps: a minute or two on
  a 2-core CPU.
  """
  return LlamaConfig(
      name="mini",
      model=ModelConfig(vocab_size=1024, width=128, num_layers=2, num_heads=4, num_kv_heads=2,
                        mlp_size=384, rope=RopeConfig(theta=10_000.0, original_context=256),
                        dtype=DType.FLOAT32, remat=Remat.NONE),
      data=DataConfig(source=Source.PYDOC, seq_length=256, train_prefix="train_text_document",
                      eval_prefix="validation_text_document", eval_examples=64),
      optimizer=AdamWCosine(base_learning_rate=1e-2, end_learning_rate=1e-3, warmup_steps=20,
                            max_steps=1000),
      global_batch_size=8,
      eval_batch_size=32,
  )
