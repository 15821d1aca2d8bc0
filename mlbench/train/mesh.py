"""The device mesh, and moving batches between hosts and the mesh.

Batches are sharded over the `data` axis: each process feeds its own rows
(`jax.make_array_from_process_local_data`), and reads back only its own rows of
per-example outputs (`local_rows`), so nothing is gathered that a host does not
need. The other axes split the model, not the batch: `model` (tensor
parallelism), `expert` (MoE dispatch), `spatial` (each image's height, see
`split_images`) and `stage` (pipeline stages, see `mlbench.train.pipeline`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mlbench.errors import UserError

DATA = "data"
SPATIAL = "spatial"
STAGE = "stage"
AXES = ("data", "model", "expert", SPATIAL, STAGE)


def make_mesh(shape: Mapping[str, int] | None = None, devices: Sequence[Any] | None = None) -> Any:
  """A mesh over all devices; `shape` maps axis names to sizes (default: all on data)."""
  import jax
  from jax.sharding import AxisType

  devices = list(devices if devices is not None else jax.devices())
  shape = dict(shape or {DATA: len(devices)})
  unknown = set(shape) - set(AXES)
  if unknown:
    raise UserError(f"unknown mesh axis {sorted(unknown)}; use: {', '.join(AXES)}")
  if DATA not in shape:
    shape = {DATA: 1, **shape}
  if int(np.prod(list(shape.values()))) != len(devices):
    raise UserError(f"mesh {shape} needs {int(np.prod(list(shape.values())))} devices, "
                    f"there are {len(devices)}")
  # Auto axes: classic GSPMD propagation (jax.make_mesh defaults to Explicit).
  return jax.make_mesh(tuple(shape.values()), tuple(shape), devices=devices,
                       axis_types=(AxisType.Auto,) * len(shape))


def batch_sharding(mesh: Any) -> Any:
  """Leading (batch) axis split over `data`, the rest replicated."""
  from jax.sharding import NamedSharding, PartitionSpec

  return NamedSharding(mesh, PartitionSpec(DATA))


def replicated(mesh: Any) -> Any:
  from jax.sharding import NamedSharding, PartitionSpec

  return NamedSharding(mesh, PartitionSpec())


def data_size(mesh: Any) -> int:
  return int(mesh.shape[DATA])


def axis_size(mesh: Any, axis: str) -> int:
  """The size of a mesh axis; 1 where the mesh (or a missing mesh) lacks it."""
  return 1 if mesh is None else int(mesh.shape.get(axis, 1))


def split_images(batch: Mapping[str, Any], keys: Sequence[str], mesh: Any) -> dict[str, Any]:
  """Spatial partitioning: the image arrays [B, H, W, C] among `batch[keys]` split by
  height over the `spatial` axis (and by batch over `data`), through the logical axis
  rules. GSPMD carries the split through every convolution computed from them and
  inserts the halo exchanges (collective-permutes) at their borders; batch-norm
  statistics, reductions over height, become all-reduces over the spatial group too.
  Each device of a spatial group already holds its replica's rows, so the split is
  local slicing, no communication. A no-op without a `spatial` axis."""
  if axis_size(mesh, SPATIAL) == 1 or not keys:
    return dict(batch)
  import jax
  from jax.sharding import NamedSharding, PartitionSpec

  from mlbench.train import sharding

  def split(x: Any) -> Any:
    spec = sharding.mesh_spec(PartitionSpec("batch", "height"), mesh, x.ndim, "an image")
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

  return {k: split(v) if k in keys else v for k, v in batch.items()}


def to_global(batch: Mapping[str, np.ndarray], sharding: Any, global_batch: int) -> dict[str, Any]:
  """Assembles this process's rows into global arrays sharded over `data`."""
  import jax

  return {k: jax.make_array_from_process_local_data(
      sharding, v, (global_batch,) + tuple(v.shape[1:])) for k, v in batch.items()}


def local_rows(x: Any) -> np.ndarray:
  """This process's rows of a batch-sharded array, in row order, as numpy."""
  shards = {}
  for s in x.addressable_shards:
    start = s.index[0].start or 0 if s.index else 0
    shards.setdefault(start, s)  # Replicas over other mesh axes hold the same rows.
  return np.concatenate([np.asarray(shards[k].data) for k in sorted(shards)], axis=0)


def replicated_value(mesh: Any, value: Any) -> Any:
  """A host value as an array replicated on every device of the mesh.

  Works with several processes (each supplies its own devices' copies), where
  jax.device_put onto devices of other processes is not allowed.
  """
  import jax

  host = np.asarray(value)
  return jax.make_array_from_callback(host.shape, replicated(mesh), lambda index: host[index])
