"""How long a collective takes on a TPU slice, from its interconnect topology.

A TPU slice is a 2-D (v2, v3, v5e, v6e) or 3-D (v4, v5p) grid of chips joined by
ICI links; a dimension has wraparound links (a torus ring) where the slice
spans the whole dimension of a pod or a cube of 4 chips (v4, v5p). The model:

- An all-reduce over the whole slice is done dimension by dimension (the
  papers' multi-dimensional ring): a reduce-scatter along each dimension in
  turn, each on the data the previous one left, then the all-gathers in
  reverse; with the buffer cut into one part per dimension, each part taking
  the dimensions in its own order, so every dimension's links are busy in
  every phase (`all_reduce_s`). Along one dimension of k chips a ring takes k - 1
  steps per phase; with wraparound, two counter-rotating rings each carry half
  the data (both directions of the links); without it (a line), one ring in
  effect (every link carries traffic both ways in turn).
- Each step costs the per-hop latency `alpha` plus its bytes over the link
  bandwidth (`link_bytes_per_s`, one direction of one link).
- Between slices (multi-slice, DCN): reduce-scatter inside the slice, an
  all-reduce of each chip's shard across slices over the data-centre network
  at each chip's share of its host's DCN bandwidth, all-gather inside the slice.

Figures per generation live in accelerators.yaml (`ici`); times come out in
seconds for one chip's buffer of `nbytes` (TPU v2/v3 TensorCores of a chip
reduce on the chip first, at no modelled cost).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Link:
  """The interconnect of one TPU generation (see accelerators.yaml, `ici`)."""

  link_bytes_per_s: float   # one ICI link, one direction
  hop_latency_s: float      # per ring step
  dcn_bytes_per_s: float = 0.0  # per chip, between slices
  dcn_latency_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class Torus:
  """A slice's chip grid and which dimensions wrap around."""

  dims: tuple[int, ...]
  wrap: tuple[bool, ...]
  slices: int = 1

  @property
  def chips(self) -> int:
    return math.prod(self.dims) * self.slices


def torus(grid: Sequence[int], pod_dims: Sequence[int] | None, cube: int = 0,
          slices: int = 1) -> Torus:
  """The torus of a chip grid: a dimension wraps where it spans the pod's whole
  dimension (`pod_dims`, 2-D generations) or is a multiple of `cube` (3-D ones)."""
  dims = tuple(int(d) for d in grid)
  if cube:
    wrap = tuple(d >= cube and d % cube == 0 for d in dims)
  elif pod_dims:
    wrap = tuple(d >= min(pod_dims) for d in dims)
  else:
    wrap = (False,) * len(dims)
  return Torus(dims=dims, wrap=wrap, slices=slices)


def ring_phase_s(nbytes: float, k: int, wrap: bool, link: Link) -> float:
  """One reduce-scatter (or all-gather) of a chip's `nbytes` along a ring of k chips."""
  if k <= 1 or nbytes <= 0:
    return 0.0
  bandwidth = link.link_bytes_per_s * (2.0 if wrap else 1.0)
  return (k - 1) * link.hop_latency_s + (k - 1) / k * nbytes / bandwidth


def all_reduce_s(nbytes: float, t: Torus, link: Link) -> float:
  """All-reduce of a buffer of `nbytes` on every chip of the slice(s), over all the
  torus's dimensions at once: the buffer is cut into one part per dimension (of more
  than one chip), each part reduce-scattered through the dimensions in its own order
  (part i starts on dimension i), so that in every phase each dimension's links carry
  one part ("How to Scale Your Model", ch. 3: a collective over several axes divides its
  time by their number); a phase lasts as long as its slowest part; the all-gathers
  retrace it."""
  dims = [(k, wrap) for k, wrap in zip(t.dims, t.wrap) if k > 1]
  total, shard = 0.0, float(nbytes)
  if dims:
    n = len(dims)
    left = [float(nbytes) / n] * n  # what each part still holds on a chip
    for phase in range(n):
      times = []
      for part in range(n):
        k, wrap = dims[(part + phase) % n]
        times.append(ring_phase_s(left[part], k, wrap, link))
        left[part] /= k
      total += 2 * max(times)  # reduce-scatter in, all-gather out: the same cost
    shard = sum(left)
  if t.slices > 1:
    total += dcn_all_reduce_s(shard, t.slices, link)
  return total


def dcn_all_reduce_s(nbytes: float, slices: int, link: Link) -> float:
  """All-reduce of each chip's shard across `slices` slices over the data-centre network."""
  if slices <= 1 or nbytes <= 0:
    return 0.0
  if link.dcn_bytes_per_s <= 0:
    return math.inf
  return 2 * ((slices - 1) * link.dcn_latency_s
              + (slices - 1) / slices * nbytes / link.dcn_bytes_per_s)


def group_s(op: str, nbytes: float, k: int, link: Link, wrap: bool = False, ops: int = 1
            ) -> float:
  """`ops` collectives among a group of k neighbouring chips (a model- or expert-parallel
  axis laid along one dimension), `nbytes` of results per chip in all."""
  if ops > 1:
    return (ops - 1) * (k - 1) * link.hop_latency_s * (2 if op == "all-reduce" else 1) \
        + group_s(op, nbytes, k, link, wrap)
  if op == "all-reduce":
    return 2 * ring_phase_s(nbytes, k, wrap, link)
  if op == "reduce-scatter":
    return ring_phase_s(nbytes * k, k, wrap, link)  # the result is one shard of k
  if op in ("all-gather", "all-to-all"):
    return ring_phase_s(nbytes, k, wrap, link)
  if k <= 1:
    return 0.0
  return link.hop_latency_s + nbytes / link.link_bytes_per_s  # collective-permute
