"""The optimizer config of the language models trained under the MLPerf 6.x LLM and MoE
rules (llama31_8b, moe): AdamW after a linear warmup, a half-cosine decay, global-norm
clipping. `mlbench.train.optim.adamw_cosine_hparams` logs it. Imports nothing heavy."""

from __future__ import annotations

import dataclasses

from mlbench.fields import at_least, fraction, positive, require


@dataclasses.dataclass(frozen=True)
class AdamWCosine:
  """AdamW with gradients clipped to global norm `clip_norm`, the learning rate warmed up
  linearly over `warmup_steps` and decayed by a half cosine to `end_learning_rate` at
  `max_steps` (NeMo's CosineAnnealing); `max_steps` is also the training budget. The
  defaults are the MLPerf 6.x LLM benchmarks' (beta 0.9/0.95, epsilon 1e-5, weight decay
  0.1, clip 1.0); each workload sets its learning rates and steps."""

  base_learning_rate: float
  end_learning_rate: float
  warmup_steps: int
  max_steps: int
  beta_1: float = 0.9
  beta_2: float = 0.95
  epsilon: float = 1e-5
  weight_decay: float = 0.1
  clip_norm: float = 1.0

  def __post_init__(self):
    at_least(self, 0, "warmup_steps", "weight_decay", "end_learning_rate")
    require(self.max_steps > self.warmup_steps, "max_steps",
            f"{self.max_steps} is not beyond warmup_steps ({self.warmup_steps})",
            "warmup_steps")
    fraction(self, "beta_1", "beta_2")
    positive(self, "base_learning_rate", "epsilon", "clip_norm")
