"""What the decoder-only language models (llama31_8b, moe) share beyond their blocks: the
byte-level BPE of their mini corpora, their synthetic token batches, and the keys of the
MLPerf 6.x LLM rules they log (AdamW with a cosine schedule, precision and parallelism)."""

from __future__ import annotations

from typing import Any

import numpy as np

from mlbench.fields import DType
from mlbench.workload import Schedule, StepContext

END_OF_TEXT = "<|endoftext|>"
"""The one special token of the mini corpora's BPE (id 0), between documents."""

PRECISION = {DType.FLOAT32: "fp32", DType.BFLOAT16: "bfloat16"}
"""DType -> the value of the 6.x `lowest_numerical_precision_in_*` keys."""


def train_tokenizer(texts: list[str], vocab_size: int):
  """A byte-level BPE tokenizer with one special token, `<|endoftext|>` (id 0)."""
  from tokenizers import ByteLevelBPETokenizer

  tokenizer = ByteLevelBPETokenizer()
  tokenizer.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2,
                                special_tokens=[END_OF_TEXT], show_progress=False)
  return tokenizer


def repeating_tokens(rng: np.random.Generator, batch_size: int, length: int, vocab_size: int,
                     *, low: int = 0, period: int = 8) -> np.ndarray:
  """[batch_size, length] int32 ids, each row a random `period`-token pattern repeated: a
  synthetic batch with a signal to learn. Ids are drawn from [low, vocab_size)."""
  pattern = rng.integers(low, vocab_size, (batch_size, period))
  return np.tile(pattern, (1, -(-length // period)))[:, :length].astype(np.int32)


def mesh_size(ctx: StepContext, axis: str) -> int:
  """The size of a mesh axis of the step (1 where the mesh lacks it, or without a mesh)."""
  return int(ctx.mesh.shape.get(axis, 1)) if ctx.mesh is not None else 1


def hparams(o: Any, sched: Schedule, ctx: StepContext, *, dtype: DType, seq_length: int,
            name: str, replicas: int, experts: int = 1) -> dict[str, Any]:
  """The 6.x keys of an LLM run: the sequence length, AdamW with its cosine schedule (`o`),
  the precision and parallelism disclosure, and micro_batch_size: sequences per
  data-parallel replica (`replicas`) per accumulation step and per pipeline microbatch, as
  the reference's MBS."""
  from mlbench.train import optim  # optax: only where a run logs its keys

  precision = PRECISION[dtype]
  pipelined = ctx.microbatches if mesh_size(ctx, "stage") > 1 else 1
  return {"max_sequence_length": seq_length,
          **optim.adamw_cosine_hparams(o),
          "lowest_numerical_precision_in_linear": precision,
          "lowest_numerical_precision_in_attn": precision,
          "lowest_numerical_precision_in_comm": precision,
          "tensor_parallelism": mesh_size(ctx, "model"),
          "pipeline_parallelism": mesh_size(ctx, "stage"),
          "context_parallelism": 1,
          "expert_parallelism": experts,
          "micro_batch_size": max(1, sched.global_batch_size // (
              replicas * sched.gradient_accumulation_steps * pipelined)),
          "config_filename": name}
