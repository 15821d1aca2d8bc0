"""Sharding as data: logical partition rules -> shardings of the whole train state.

A workload tags parameters with logical axis names through regex rules
(`[(r"attention/(query|key|value)/kernel$", P("embed", "heads")), ...]`). The
harness maps logical names onto mesh axes with `AXIS_RULES` and applies the
result to every leaf of the train state whose path matches: the parameters and
the optimizer state that mirrors them (`opt_state/.../attention/query/kernel`).
Leaves no rule matches are replicated. Axes the mesh lacks (or has with size 1)
are dropped, so the same rules serve a data-only mesh and a model-parallel one.

A workload's layer stack (`Workload.layer_stack`: one layer's parameters stacked
on a leading layer axis) is written for one layer: the harness adds the layer
axis, logical `layers`, which a `stage` mesh axis splits into pipeline stages
(contiguous blocks of layers, one per stage).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from mlbench.errors import UserError

# Logical axis -> mesh axis. Data, not code: extend here, never in a workload.
AXIS_RULES: Mapping[str, str | None] = {
    "batch": "data",
    "embed": None,
    "fsdp": "data",   # a width axis split over data: fully sharded parameters (FSDP)
    "mlp": "model",
    "heads": "model",
    "kv": None,
    "vocab": "model",
    "channels": "model",
    "expert": "expert",
    "height": "spatial",  # an image's rows: spatial partitioning
    "layers": "stage",    # a layer stack's leading axis: pipeline stages
}


def path_str(path: Sequence[Any]) -> str:
  """'opt_state/0/trace/conv/kernel' for a jax key path."""
  parts = []
  for p in path:
    for attr in ("key", "name", "idx"):
      if hasattr(p, attr):
        parts.append(str(getattr(p, attr)))
        break
    else:
      parts.append(str(p))
  return "/".join(parts)


def mesh_spec(logical: Any, mesh: Any, ndim: int, where: str) -> Any:
  """Maps a logical PartitionSpec onto `mesh`; drops axes the mesh does not split."""
  from jax.sharding import PartitionSpec

  if len(logical) > ndim:
    raise UserError(f"partition rule for {where} has {len(logical)} axes but the array has {ndim}")
  out = []
  for name in logical:
    if name is None:
      out.append(None)
      continue
    if name not in AXIS_RULES:
      raise UserError(f"unknown logical axis '{name}' in the rule for {where}; "
                      f"known: {', '.join(AXIS_RULES)}")
    axis = AXIS_RULES[name]
    out.append(axis if axis in mesh.shape and mesh.shape[axis] > 1 else None)
  while out and out[-1] is None:  # P(None, None) and P() mean the same; keep one form.
    out.pop()
  return PartitionSpec(*out)


def tree_shardings(tree: Any, rules: Sequence[tuple[str, Any]], mesh: Any,
                   stack: str | None = None) -> Any:
  """NamedShardings for every leaf of `tree` (arrays or ShapeDtypeStructs).

  Leaves under the parameter subtree `stack` (a layer stack's path, `layers`) get the
  logical `layers` axis in front of what their rule says of one layer.
  """
  import jax
  from jax.sharding import NamedSharding, PartitionSpec

  compiled = [(re.compile(pattern), spec) for pattern, spec in rules]
  in_stack = re.compile(rf"(^|/){re.escape(stack)}/") if stack else None

  def one(path, leaf):
    where = path_str(path)
    stacked = in_stack is not None and in_stack.search(where) is not None and len(leaf.shape)
    logical = next((spec for pattern, spec in compiled if pattern.search(where)), PartitionSpec())
    if stacked:
      logical = PartitionSpec("layers", *logical)
    return NamedSharding(mesh, mesh_spec(logical, mesh, len(leaf.shape), where))

  return jax.tree_util.tree_map_with_path(one, tree)


def over_data(tree: Any, shardings: Any, mesh: Any) -> Any:
  """Weight-update sharding (Xu et al. 2020): each leaf also split over `data`.

  The largest dimension the data axis divides, among those no rule already
  shards, is split over it; leaves with none (scalars, odd sizes) keep their
  sharding. Applied to the optimizer state and to the parameters during the
  update, this makes XLA reduce-scatter the gradients, update 1/N of every
  tensor per replica and all-gather the new parameters. Norms in LARS and LAMB
  stay global: they are reductions over the logical (sharded) arrays.
  """
  import jax
  from jax.sharding import NamedSharding, PartitionSpec

  n = int(mesh.shape.get("data", 1))

  def one(leaf, sh):
    spec = list(sh.spec) + [None] * (len(leaf.shape) - len(sh.spec))
    named = {a for s in spec if s for a in (s if isinstance(s, tuple) else (s,))}
    free = [d for d, s in enumerate(spec) if s is None and leaf.shape[d] % n == 0]
    if n == 1 or "data" in named or not free:
      return sh
    spec[max(free, key=lambda d: leaf.shape[d])] = "data"
    while spec and spec[-1] is None:
      spec.pop()
    return NamedSharding(mesh, PartitionSpec(*spec))

  return jax.tree.map(one, tree, shardings)


def bytes_per_device(tree: Any, shardings: Any) -> int:
  """Bytes one device holds of `tree` (arrays or shapes) under `shardings`."""
  import jax
  import numpy as np

  return int(sum(np.prod(sh.shard_shape(leaf.shape)) * np.dtype(leaf.dtype).itemsize
                 for leaf, sh in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings))))
