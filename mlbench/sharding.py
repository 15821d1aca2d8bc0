"""Sharding as data: logical partition rules -> shardings of the whole train state.

A workload tags parameters with logical axis names through regex rules
(`[(r"attention/(query|key|value)/kernel$", P("embed", "heads")), ...]`). The
harness maps logical names onto mesh axes with `AXIS_RULES` and applies the
result to every leaf of the train state whose path matches: the parameters and
the optimizer state that mirrors them (`opt_state/.../attention/query/kernel`).
Leaves no rule matches are replicated. Axes the mesh lacks (or has with size 1)
are dropped, so the same rules serve a data-only mesh and a model-parallel one.
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
    "mlp": "model",
    "heads": "model",
    "kv": None,
    "vocab": "model",
    "expert": "expert",
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


def tree_shardings(tree: Any, rules: Sequence[tuple[str, Any]], mesh: Any) -> Any:
  """NamedShardings for every leaf of `tree` (arrays or ShapeDtypeStructs)."""
  import jax
  from jax.sharding import NamedSharding, PartitionSpec

  compiled = [(re.compile(pattern), spec) for pattern, spec in rules]

  def one(path, leaf):
    where = path_str(path)
    for pattern, spec in compiled:
      if pattern.search(where):
        return NamedSharding(mesh, mesh_spec(spec, mesh, len(leaf.shape), where))
    return NamedSharding(mesh, PartitionSpec())

  return jax.tree_util.tree_map_with_path(one, tree)
