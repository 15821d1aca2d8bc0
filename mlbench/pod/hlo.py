"""The collectives in an optimized HLO program: how many, how many bytes, bytes on the wire.

Read from `compiled.as_text()`, or, where XLA cannot print a program (it fails to
re-read some that libtpu writes: "async-update instruction should have 1 operands"),
from its HloModuleProto with protobuf alone (`collectives_from_proto`). Each collective's result shape gives its bytes;
its replica groups give how many devices take part, and from both a ring
algorithm's traffic per device follows (what the roofline's interconnect term
divides by the link bandwidth). An op inside a loop body is counted once, as it
is written, not once per iteration.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator
from typing import Any

COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "collective-permute")

_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2,
             "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8,
             "c64": 8, "c128": 16}
_LINE = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<shape>\(.*?\)|\w+\[[\d,]*\]\S*)\s+"
                   r"(?P<op>" + "|".join(COLLECTIVES) + r")(?P<start>-start)?\(", re.M)
_ARRAY = re.compile(r"(\w+)\[([\d,]*)\]")


@dataclasses.dataclass(frozen=True)
class Collectives:
  """Per collective kind: ops in the program, bytes of their results, bytes each device
  sends (ring algorithm)."""

  count: dict[str, int]
  result_bytes: dict[str, int]
  wire_bytes: dict[str, float]
  by_group: dict[int, int] = dataclasses.field(default_factory=dict)  # result bytes by group size

  @property
  def total_wire_bytes(self) -> float:
    return float(sum(self.wire_bytes.values()))


def _arrays(shape: str) -> list[int]:
  """Bytes of each array in an HLO shape (a tuple gives several)."""
  out = []
  for dtype, dims in _ARRAY.findall(shape):
    n = 1
    for d in filter(None, dims.split(",")):
      n *= int(d)
    out.append(n * _ITEMSIZE.get(dtype, 4))
  return out


def _group_size(line: str, devices: int) -> int:
  """Devices per replica group: {{0,1},{2,3}} lists them, [2,4]<=[8] gives the shape."""
  m = re.search(r"replica_groups=\{(\{[\d,]*\})", line)
  if m:
    return max(1, len([x for x in m.group(1).strip("{}").split(",") if x]))
  m = re.search(r"replica_groups=\[([\d,]+)\]<=", line)
  if m:
    return int(m.group(1).split(",")[-1])
  if "source_target_pairs" in line:
    return 2
  return devices


def _result_bytes(op: str, start: bool, shape: str) -> int:
  sizes = _arrays(shape)
  if not sizes:
    return 0
  if start and op == "all-gather":
    return max(sizes)      # (operand, gathered result)
  if start and op == "collective-permute":
    return sizes[0]        # (operand, result, context...)
  return sum(sizes)


def _wire(op: str, nbytes: int, n: int) -> float:
  """Bytes one device sends for a collective over `n` devices (ring algorithms)."""
  if n <= 1:
    return 0.0
  if op == "all-reduce":
    return 2.0 * (n - 1) / n * nbytes
  if op == "reduce-scatter":
    return float((n - 1) * nbytes)  # The result is one shard of n.
  if op in ("all-gather", "all-to-all"):
    return (n - 1) / n * nbytes
  return float(nbytes)  # collective-permute: send it all once.


def _tally(ops: Iterable[tuple[str, int, int]]) -> Collectives:
  """`Collectives` of (op, result bytes, group size) triples, one per collective op."""
  count = dict.fromkeys(COLLECTIVES, 0)
  result = dict.fromkeys(COLLECTIVES, 0)
  wire = dict.fromkeys(COLLECTIVES, 0.0)
  by_group: dict[int, int] = {}
  for op, nbytes, group in ops:
    count[op] += 1
    result[op] += nbytes
    wire[op] += _wire(op, nbytes, group)
    by_group[group] = by_group.get(group, 0) + nbytes
  return Collectives(count=count, result_bytes=result, wire_bytes=wire, by_group=by_group)


def collectives(hlo_text: str, devices: int = 1) -> Collectives:
  """The collectives of an optimized HLO module (async start/done pairs count once)."""
  def ops() -> Iterator[tuple[str, int, int]]:
    for m in _LINE.finditer(hlo_text):
      op, start = m.group("op"), bool(m.group("start"))
      line = hlo_text[m.start():hlo_text.find("\n", m.end())]
      yield op, _result_bytes(op, start, m.group("shape")), _group_size(line, devices)

  return _tally(ops())


_DEF = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\w+)\[", re.M)
_MATMUL = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*\S+\s+(dot|convolution)\(([^)]*)\)", re.M)


def matmul_input_dtypes(hlo_text: str) -> dict[str, int]:
  """How many dots and convolutions take which input dtypes ('bf16', 'f32', 'bf16 x f32')."""
  dtype_of = dict(_DEF.findall(hlo_text))
  out: dict[str, int] = {}
  for _, operands in _MATMUL.findall(hlo_text):
    names = re.findall(r"%([\w.\-]+)", operands)[:2]
    kinds = sorted({dtype_of.get(n, "?") for n in names})
    key = " x ".join(kinds)
    out[key] = out.get(key, 0) + 1
  return out


# The HLO module proto's element types (xla_data.proto PrimitiveType) and their bytes.
_PROTO_ITEMSIZE = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 2, 8: 4, 9: 8, 10: 2, 11: 4, 12: 8,
                   15: 8, 16: 2, 18: 16, 19: 1, 20: 1}


def _proto_bytes(shape) -> list[int]:
  if shape.tuple_shapes:
    return [b for s in shape.tuple_shapes for b in _proto_bytes(s)]
  n = 1
  for d in shape.dimensions:
    n *= int(d)
  return [n * _PROTO_ITEMSIZE.get(int(shape.element_type), 4)] if shape.element_type else []


def _proto_group(ins, devices: int) -> int:
  if ins.replica_groups:
    return max(1, len(ins.replica_groups[0].replica_ids))
  if ins.HasField("collective_device_list"):
    cdl = ins.collective_device_list
    if cdl.replica_groups:
      return max(1, len(cdl.replica_groups[0].replica_ids))
    if cdl.HasField("iota_replica_group_list"):
      return int(cdl.iota_replica_group_list.num_devices_per_group)
  if ins.HasField("iota_collective_device_list"):
    return int(ins.iota_collective_device_list.num_devices_per_group)
  return 2 if ins.source_target_pairs else devices


def module_proto(serialized: bytes) -> Any:
  """A serialized HloModuleProto, read with protobuf alone (no XLA re-parsing, which
  refuses some programs libtpu writes)."""
  from tensorflow.compiler.xla.service import hlo_pb2  # TF ships XLA's protos

  return hlo_pb2.HloModuleProto.FromString(serialized)


def collectives_from_proto(serialized: bytes, devices: int = 1) -> Collectives:
  """The collectives of a serialized HloModuleProto, read with protobuf alone (no XLA
  re-parsing, which refuses some programs libtpu writes). Ops wrapped in async
  computations are counted where they are written; -done halves are skipped."""
  module = module_proto(serialized)

  def ops() -> Iterator[tuple[str, int, int]]:
    for comp in module.computations:
      for ins in comp.instructions:
        start = ins.opcode.endswith("-start")
        op = ins.opcode.removesuffix("-start")
        if op not in COLLECTIVES:
          continue
        sizes = _proto_bytes(ins.shape)
        nbytes = (max(sizes) if start and op == "all-gather" else
                  sizes[0] if start and op == "collective-permute" and sizes else sum(sizes))
        yield op, nbytes, _proto_group(ins, devices)

  return _tally(ops())
