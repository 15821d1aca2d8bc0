"""How a Mixture-of-Experts layer splits over a device mesh: what both of mlbench's MoE
layers share (GShard's capacity dispatch, `workloads/moe/layer.py`, and the dropless one,
`workloads/common/dropless_moe.py`).

GShard's design (Lepikhin et al. 2020), kept by both: the tokens are split over every
device that holds any (mesh axes `data` and `expert`), the experts over `expert`; each
device routes its own tokens and an all-to-all over `expert` carries them to the devices
that hold their experts and back. The layer runs as an explicit per-device program
(`jax.shard_map`): GSPMD sharding annotations alone were seen to all-gather the tokens.
Without an `expert` axis (or inside a pipeline stage) it is one program, which GSPMD
splits by the parameters' annotations (FSDP: the experts' weights gathered per layer).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax

from mlbench.errors import UserError

EXPERT = "expert"
TOKEN_AXES = ("data", "expert")
"""Mesh axes the tokens are split over: all of GShard's devices hold tokens."""


def token_axes(mesh: Any) -> tuple[str, ...]:
  """The mesh axes the tokens (groups) are split over."""
  return tuple(a for a in TOKEN_AXES if a in mesh.shape)


def expert_shards(mesh: Any | None) -> int:
  """Devices the experts are split over (the `expert` axis; 1 without one)."""
  return int(mesh.shape.get(EXPERT, 1)) if mesh is not None else 1


def one_program(mesh: Any | None) -> bool:
  """Whether the layer runs as one program (no mesh, one device, or inside a pipeline
  stage, whose `stage` axis is already manual: nesting a second per-device program there
  is what JAX 0.10 cannot differentiate)."""
  context = jax.sharding.get_abstract_mesh()
  return mesh is None or mesh.devices.size == 1 or (not context.empty and
                                                      bool(context.manual_axes))


def check_split(mesh: Any, *, experts: int, rows: int) -> tuple[tuple[str, ...], int]:
  """(token axes, expert shards) of `mesh` for a layer of `experts` experts over `rows`
  rows (sequences or tokens) of tokens.

  Raises:
    UserError: the experts or the rows do not split evenly over the mesh, in one line.
  """
  axes, shards = token_axes(mesh), expert_shards(mesh)
  if experts % shards:
    raise UserError(f"{experts} experts do not split over the {shards} devices of mesh axis "
                    f"'{EXPERT}'; use an expert axis that divides the number of experts")
  devices = int(math.prod(mesh.shape[a] for a in axes))
  if rows % devices:
    raise UserError(f"{rows} sequences do not split over the {devices} devices of "
                    f"mesh axes {axes}; use batch sizes that are multiples of {devices}")
  return axes, shards


TOKENS, WHOLE, EXPERTS = "tokens", "whole", "experts"
"""How `per_device` splits an argument: over the token axes (leading axis), not at all,
or over `expert` (leading axis, every expert's weights)."""


def per_device(body: Callable[..., Any], mesh: Any, kinds: tuple[str, ...], *,
               axes: tuple[str, ...], sharded: bool,
               out_kinds: tuple[str, ...] | str = (TOKENS, WHOLE),
               check_vma: bool = True) -> Callable:
  """`body` as a per-device program over `mesh`, its arguments split as `kinds` says
  (`TOKENS`, `WHOLE`, `EXPERTS`; experts whole unless `sharded`), its results as
  `out_kinds` (a tuple of them, or one for a single array). `check_vma=False` where the
  body holds a Pallas kernel whose output types say nothing of the mesh axes they vary
  over (megablox's gmm: shard_map refuses it otherwise)."""
  from jax.sharding import PartitionSpec as P

  spec = {TOKENS: P(axes), WHOLE: P(), EXPERTS: P(EXPERT) if sharded else P()}
  outs = spec[out_kinds] if isinstance(out_kinds, str) else tuple(spec[k] for k in out_kinds)
  return jax.shard_map(body, mesh=mesh, in_specs=tuple(spec[k] for k in kinds),
                       out_specs=outs, check_vma=check_vma)
