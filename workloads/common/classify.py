"""What the image classifiers (resnet50, efficientnet, vit) evaluate alike: per image, the
top-1 hit and the (unsmoothed) cross-entropy; from their sums, accuracy and mean loss."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from mlbench.workload import EvalPart


def eval_outputs(logits_BK: jax.Array, labels_B: jax.Array) -> dict[str, jax.Array]:
  """An eval step's per-image outputs from the model's logits and the labels."""
  return {"correct": (jnp.argmax(logits_BK, -1) == labels_B).astype(jnp.float32),
          "loss": optax.softmax_cross_entropy_with_integer_labels(logits_BK, labels_B)}


def compute(cfg: Any, part: EvalPart) -> dict[str, float]:
  """`EvalSpec.compute`: top-1 accuracy (the quality metric) and the mean loss."""
  del cfg
  return {"accuracy": float(part.sums["correct"] / part.count),
          "loss": float(part.sums["loss"] / part.count)}
