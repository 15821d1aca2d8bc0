"""Where a compiled train step's HBM bytes go: XLA's "bytes accessed", op by op, by kind.

The ops and their bytes come from the optimized HLO (`hloops`); each op is given one
kind from the names jax wrote into its metadata (the name stack: flax modules, the
`jvp(...)` of the forward pass, the `transpose(jvp(...))` of the backward pass, the
optimizer's update outside both) and from what it holds:

- collectives: all-reduce, all-gather, ... and their buffers;
- dropout random bits: ops that write random bits or masks (u32 or pred, 64 Ki elements
  or more) drawn by `jax.random` (a TPU program fuses the bits into their consumers and
  writes none; XLA:CPU writes them);
- optimizer update: everything outside the differentiated loss (gradient clipping,
  moments, trust ratios, the new parameters) and the step's metric sums;
- attention, scores and probabilities: the ops of an attention module other than its
  projections (the [B, N, L, S] scores, softmax, dropout, the products with the values),
  and attention, masks and bias: those writing no per-head array (rank 3 or less) and
  no matmul (segment, padding and causal masks, an additive bias);
- embeddings and heads: the embeddings (and their layer norm), the output heads and the
  loss computed on their logits (what the loss function computes outside any module);
- matmuls: ops holding a dot or convolution (projections, MLPs), with what XLA fused in;
- norms and elementwise: the rest of the model (layer norms, residual adds, activations
  and dropout not fused into a matmul);
- other: what none of these claims.
A prefetch between memories (copy-start/done, slice-start/done, the ConcatBitcast
joining slices), and an op XLA wrote no names for, take the kind of the op that reads
what they wrote (an eviction to the outputs: of the op that wrote it).

The parts add up to XLA's total: what XLA counts beyond the ops' sum (its cost model is
libtpu's, not quite the rules `hloops` follows) is its own part, `unattributed`, signed
(measured on v4-8, libtpu 0.0.52: -1.0% of a 2-layer BERT-large step at batch 256, -2.2%
of a 2+2-layer Transformer-big's, -6.8% of a tiny BERT's mostly optimizer update). Ops of a numbered layer
(`layer_3`, `encoder_0`, `decoder_5`, `block2`) are also summed per kind in `in_layers`, so the bytes
a layer adds can be read off a reduced config and scaled to the full one. XLA counts a
loop's body once however often it runs (`hloops`); what the repeats move is told apart
(`loop_repeats`), in no part.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import Any

from mlbench.pod import hlo, hloops, hloproto
from mlbench.pod.hloops import Op

ATTENTION = "attention, scores and probabilities"
MASKS = "attention, masks and bias"
RANDOM_BITS = "dropout random bits"
MATMULS = "matmuls"
ELEMENTWISE = "norms and elementwise"
HEADS = "embeddings and heads"
OPTIMIZER = "optimizer update"
COLLECTIVES = "collectives"
OTHER = "other"
KINDS = (ATTENTION, MASKS, RANDOM_BITS, MATMULS, ELEMENTWISE, HEADS, OPTIMIZER, COLLECTIVES,
         OTHER)
UNATTRIBUTED = "unattributed"

# The name-stack patterns each kind is read from (flax module names of the workloads:
# BERT's `attention`, the Transformer's `self_attention`/`cross_attention`, ...).
_ATTENTION = re.compile(r"/(?:\w+_)?attention(?:_\d+)?/")
_PROJECTION = re.compile(r"/(?:\w+_)?attention(?:_\d+)?/(?:query|key|value|output|qkv|out)/")
# What the loss function computes outside the model's modules: `jvp()`, `jvp(jit(take))`.
_HEADS = re.compile(r"embed|_masked_lm|mlm_|next_sentence|pooler|project|logits|loss"
                    r"|jvp\((?:jit\(\w*\))?\)")
_IN_MODEL = re.compile(r"jvp\(")
_LAYER = re.compile(r"/(?:layer|encoder|decoder|layers|block)_?(\d+)/")
_RANDOM = re.compile(r"random_bits|threefry|bernoulli|_uniform|rng")
_MATMUL_OPS = frozenset({"dot", "convolution"})
_COLLECTIVE_OPS = frozenset(c + s for c in hlo.COLLECTIVES for s in ("", "-start", "-done"))
_RANDOM_MIN_ELEMENTS = 1 << 16


@dataclasses.dataclass(frozen=True)
class TopOp:
  """One of the ops that move the most bytes."""

  name: str
  kind: str
  nbytes: int
  op_name: str
  outputs: str  # 'bf16[33,16,512,512]'


@dataclasses.dataclass(frozen=True)
class Breakdown:
  """XLA's bytes accessed of one program, per device, by kind (`KINDS`, then
  `UNATTRIBUTED`); the same kinds summed over the ops of numbered layers; how many
  layers those were; the ops that move the most."""

  total: float
  parts: dict[str, float]
  in_layers: dict[str, float]
  layers: int
  between_memories: float = 0.0  # of the parts: prefetches and evictions as XLA counts them
  by_memory_space: dict[int, float] = dataclasses.field(default_factory=dict)  # of the ops' sum
  loop_repeats: float = 0.0  # what XLA leaves out: the bytes of a loop body's repeat runs
  top: tuple[TopOp, ...] = ()

  @property
  def unattributed(self) -> float:
    return self.parts.get(UNATTRIBUTED, 0.0)


def _largest(op: Op) -> hloops.Array | None:
  return max(op.outputs, key=lambda a: a.nbytes, default=None)


def _elements(a: hloops.Array) -> int:
  n = 1
  for d in a.dims:
    n *= d
  return n


def _is_random_bits(op: Op) -> bool:
  names = " ".join((op.op_name, *op.fused_names))
  return bool(_RANDOM.search(names)) and any(
      a.dtype in ("u32", "u8", "u16", "pred") and _elements(a) >= _RANDOM_MIN_ELEMENTS
      for a in op.outputs)


def kind_of(op: Op) -> str:
  """The kind (one of `KINDS`) of one op that is no prefetch (see the module docstring)."""
  name = op.op_name or (op.fused_names[0] if op.fused_names else "")
  matmul = op.opcode in _MATMUL_OPS or bool(op.fused_opcodes & _MATMUL_OPS)
  if op.opcode in _COLLECTIVE_OPS:
    return COLLECTIVES
  if _is_random_bits(op):
    return RANDOM_BITS
  if not name:  # XLA wrote no metadata (XLA:CPU's convolutions, for one)
    return MATMULS if matmul else OTHER
  if not _IN_MODEL.search(name):
    return OPTIMIZER
  if _ATTENTION.search(name) and not _PROJECTION.search(name):
    big = _largest(op)
    return ATTENTION if matmul or (big is not None and len(big.dims) >= 4) else MASKS
  if _HEADS.search(name):
    return HEADS
  if matmul:
    return MATMULS
  return ELEMENTWISE


def _moves(op: Op) -> bool:
  """A prefetch or eviction between memories, or what joins or unpacks one."""
  return (op.opcode in hloops.PREFETCH or op.target == hloops.CONCAT_BITCAST
          or op.opcode in ("bitcast", "get-tuple-element"))


def _serves(op: Op) -> bool:
  """An op that takes its kind from the op it serves: a prefetch or eviction, or an op
  XLA wrote no names for (a layout copy, a padded weight: XLA:CPU's convolutions)."""
  return _moves(op) or (not op.op_name and not op.fused_names and op.target != hloops.PALLAS
                        and op.opcode not in _COLLECTIVE_OPS)


def _sources(ops: list[Op]) -> dict[str, Op]:
  """For each op that moves bytes, the op whose kind and layer it takes: itself; for a
  prefetch (or a nameless op), the op that reads what it fetched; for an eviction (a copy
  on the way to the program's outputs), the op that wrote it."""
  readers: dict[str, list[str]] = {}
  for op in ops:
    for o in op.operands:
      readers.setdefault(o, []).append(op.name)
  by_name = {op.name: op for op in ops}

  def find(name: str, forward: bool, seen: frozenset[str]) -> Op | None:
    op = by_name.get(name)
    if op is None or op.opcode == "tuple":  # the program's outputs
      return None
    if not _serves(op):
      return op
    for n in readers.get(name, ()) if forward else op.operands:
      if n not in seen and (found := find(n, forward, seen | {name})) is not None:
        return found
    return None

  return {op.name: (op if not _serves(op) else find(op.name, True, frozenset())
                    or find(op.name, False, frozenset()) or op)
          for op in ops if op.nbytes}


def breakdown(ops: list[Op], xla_total: float | None, top: int = 12) -> Breakdown:
  """The breakdown of a program's `ops` against XLA's total bytes accessed (None: the
  ops' own sum, nothing unattributed)."""
  sources = _sources(ops)
  kinds = {name: kind_of(src) for name, src in sources.items()}
  parts = dict.fromkeys(KINDS, 0.0)
  in_layers = dict.fromkeys(KINDS, 0.0)
  layers: set[str] = set()
  moved, repeats, spaces = 0.0, 0.0, {}
  arrays = {op.name: op.outputs for op in ops}
  for op in ops:
    if not op.nbytes:
      continue
    k = kinds[op.name]
    parts[k] += op.nbytes
    moved += op.nbytes if _moves(op) else 0
    repeats += (op.trips - 1) * op.nbytes
    for space, n in _by_space(op, arrays).items():
      spaces[space] = spaces.get(space, 0.0) + n
    layer = _LAYER.search(sources[op.name].op_name)
    if layer:
      in_layers[k] += op.nbytes
      layers.add(layer.group(0))
  counted = sum(parts.values())
  total = counted if xla_total is None else float(xla_total)
  parts[UNATTRIBUTED] = total - counted
  biggest = sorted((op for op in ops if op.nbytes), key=lambda op: -op.nbytes)[:top]
  return Breakdown(total=total, parts=parts, in_layers=in_layers, layers=len(layers),
                   between_memories=moved, by_memory_space=dict(sorted(spaces.items())),
                   loop_repeats=repeats,
                   top=tuple(TopOp(op.name, kinds[op.name], op.nbytes, op.op_name,
                                   _describe(op.outputs)) for op in biggest))


def _by_space(op: Op, arrays: dict[str, tuple[hloops.Array, ...]]) -> dict[int, float]:
  """An op's bytes by memory space (0: HBM; a TPU's others are on the chip): what it reads
  shared out over its operands' arrays, what it writes over its own, by their bytes."""
  out: dict[int, float] = {}
  for moved, held in ((op.read_bytes, [a for o in op.operands for a in arrays.get(o, ())]),
                      (op.written_bytes, list(op.outputs))):
    size = sum(a.nbytes for a in held)
    for a in held if size else ():
      out[a.memory_space] = out.get(a.memory_space, 0.0) + moved * a.nbytes / size
  return out


def _describe(arrays: Iterable[hloops.Array]) -> str:
  return ", ".join(f"{a.dtype}[{','.join(map(str, a.dims))}]" for a in arrays)


def of_compiled(compiled: Any, hlo_text: str = "") -> Breakdown | None:
  """The breakdown of a compiled program (its text where given, else its module proto);
  None where neither can be read or XLA gives no bytes accessed."""
  from mlbench.pod import xlacost

  total = xlacost.cost_analysis(compiled).get("bytes accessed")
  if total is None:
    return None
  try:
    if hlo_text:
      ops = hloops.from_text(hlo_text)
    else:
      proto = compiled.runtime_executable().hlo_modules()[0].as_serialized_hlo_module_proto()
      ops = hloproto.ops(hlo.module_proto(proto))
  except Exception:  # an unreadable program has no breakdown; the rest of the report stands
    return None
  return breakdown(ops, total)
