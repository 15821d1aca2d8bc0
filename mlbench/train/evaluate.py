"""Distributed evaluation: every device and host scores its share, exactly once.

Each host feeds its padded share of the evaluation set (`data.eval_dataset`);
the compiled eval step returns per-example outputs; each host reads back its
own rows, drops the padding by the mask, and the workload's host part turns
them into an `EvalPart` (sums and rows). Parts are merged across batches, then
across processes (sums added, rows concatenated), and the workload's
`compute` runs once on the merged part. The count of real examples must equal
the evaluation set size, or the evaluation is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from mlbench.train import data, mesh as mesh_lib
from mlbench.errors import UserError
from mlbench.workload import EvalPart, Workload


def merge(a: EvalPart, b: EvalPart) -> EvalPart:
  """Sums added, rows concatenated, counts added."""
  sums = dict(a.sums)
  for k, v in b.sums.items():
    sums[k] = sums[k] + v if k in sums else np.asarray(v)
  rows = dict(a.rows)
  for k, v in b.rows.items():
    rows[k] = np.concatenate([rows[k], v]) if k in rows else np.asarray(v)
  return EvalPart(sums=sums, rows=rows, count=a.count + b.count)


def _host_part(workload: Workload, cfg: Any, outputs: dict[str, Any],
               batch: dict[str, np.ndarray]) -> EvalPart:
  local = {k: mesh_lib.local_rows(v) for k, v in outputs.items()}
  keep = np.asarray(batch[data.MASK]) > 0
  real_out = {k: v[keep] for k, v in local.items()}
  real_batch = {k: v[keep] for k, v in batch.items() if k != data.MASK}
  part = workload.eval.host(cfg, real_out, real_batch)
  part.count = int(keep.sum())
  return part


def across_processes(part: EvalPart) -> EvalPart:
  """Merges every process's part into the same total on all processes."""
  import jax

  if jax.process_count() == 1:
    return part

  sums = {k: _allgather_exact(np.asarray(v)).sum(axis=0) for k, v in part.sums.items()}
  count = int(_allgather_exact(np.asarray(part.count, np.int64)).sum())
  rows = {k: _allgather_rows(np.asarray(v)) for k, v in part.rows.items()}
  return EvalPart(sums=sums, rows=rows, count=count)


def _allgather_exact(x: np.ndarray) -> np.ndarray:
  """process_allgather that keeps every bit: JAX would cast float64 and int64 to
  32 bits, so the bytes travel as uint8. Returns [processes, *x.shape]."""
  from jax.experimental import multihost_utils as mhu

  raw = np.frombuffer(np.ascontiguousarray(x).tobytes(), np.uint8)
  gathered = np.asarray(mhu.process_allgather(raw))
  return np.stack([np.frombuffer(g.tobytes(), x.dtype).reshape(x.shape) for g in gathered])


def _allgather_rows(x: np.ndarray) -> np.ndarray:
  lengths = _allgather_exact(np.asarray(len(x), np.int64)).reshape(-1)
  padded = np.zeros((int(lengths.max()),) + x.shape[1:], x.dtype)
  padded[:len(x)] = x
  gathered = _allgather_exact(padded)
  return np.concatenate([gathered[i, :n] for i, n in enumerate(lengths)])


def evaluate(workload: Workload, cfg: Any, step: Callable[[Any, Any], Any], state: Any,
             batches: Iterable[tuple[dict[str, np.ndarray], Any]],
             expected: int) -> tuple[dict[str, float], EvalPart]:
  """Runs one full evaluation.

  Args:
    step: the compiled eval step, (state, device_batch) -> outputs.
    state: the train state.
    batches: (host_batch, device_batch) pairs of this host's padded share.
    expected: evaluation set size; the merged count must equal it.

  Returns:
    (metrics, merged part).
  """
  total = EvalPart()
  pending = None  # One batch in flight: the host part of batch i runs while i+1 computes.
  for host_batch, device_batch in batches:
    outputs = step(state, device_batch)
    if pending is not None:
      total = merge(total, _host_part(workload, cfg, *pending))
    pending = (outputs, host_batch)
  if pending is not None:
    total = merge(total, _host_part(workload, cfg, *pending))
  total = across_processes(total)
  if total.count != expected:
    raise UserError(f"evaluation saw {total.count} examples but the evaluation set has "
                       f"{expected}; the data under --data-dir does not match the config")
  return workload.eval.compute(cfg, total), total
