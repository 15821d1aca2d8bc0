"""The device mesh, and moving batches between hosts and the mesh.

Batches are sharded over the `data` axis: each process feeds its own rows
(`jax.make_array_from_process_local_data`), and reads back only its own rows of
per-example outputs (`local_rows`), so nothing is gathered that a host does not
need.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mlbench.errors import UserError

DATA = "data"
AXES = ("data", "model", "expert")


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
