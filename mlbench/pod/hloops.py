"""Every op of a compiled program's optimized HLO and the memory bytes it moves.

Read from `compiled.as_text()` (`from_text`), or, where XLA cannot print the program, from
its HloModuleProto with protobuf alone (`hloproto.ops`); both give the same `Op`s: the
instructions of the entry computation (and of the loops, calls and branches it runs, each
once, as written), a fusion as one op with the names and opcodes of what it fused.

Bytes follow XLA's cost analysis ("bytes accessed": what each op reads and writes),
with array sizes as the layout lays them out (a TPU tile pads its minor dimensions: a
bf16[33,83] tiled (8,128) takes 40 x 128 elements). What XLA counts for the ops that move
buffers between memories was measured on libtpu 0.0.52 (a v4 program holding a prefetched
weight): `copy-start` its operand and its whole result (destination, source, context),
`copy-done` its result; a sliced prefetch (`slice-start`) its slice read and written,
`slice-done` its result; a "ConcatBitcast" joining the slices its result. A slice reads
what it writes, a dynamic-update-slice its update read and written (in a fusion too: the
rest of the buffer it updates in place is neither read nor written). Parameters,
constants, tuples, tuple elements and bitcasts move nothing, nor do loops, calls and
branches themselves (the ops they run do). A fusion reads of each operand what its fused
ops take of it (XLA's FusionParameterReadBytes: a slice's slice, once for all plain uses). A custom fusion holding a
gather moves what it gathers, read and written, and its indices; one holding a scatter its
updates three times (read, the buffer read and written) and its indices.
A Pallas kernel moves the bytes it declares (`pl.CostEstimate`), or, declaring none,
nothing: the TPU compiler counts such a kernel as free (see `xlacost`).

XLA's cost analysis counts a loop's body once, however many times it runs (measured on
libtpu 0.0.52: a `lax.map` over 4 or 16 chunks costs a quarter or a sixteenth of the same
work unchunked). Each op says how many times it runs (`trips`: the product of its loops'
trip counts, read from a condition `i < N` with a constant N; 1 where unknown), so what
XLA leaves out can be told apart.

Shape suffixes: none (HLO shapes are read as they are written).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

_ITEM_BITS = {"pred": 8, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "bf16": 16,
              "f16": 16, "s32": 32, "u32": 32, "f32": 32, "s64": 64, "u64": 64, "f64": 64,
              "c64": 64, "c128": 128}
FREE = frozenset({"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
                  "add-dependency", "opt-barrier", "while", "call", "conditional"})
PREFETCH = frozenset({"copy-start", "copy-done", "slice-start", "slice-done"})
CONCAT_BITCAST = "ConcatBitcast"
PALLAS = "tpu_custom_call"
_DECLARED = re.compile(r'bytes_accessed\\?"\s*:\s*"?(\d+)')


@dataclasses.dataclass(frozen=True)
class Array:
  """One array of a shape: dtype, dimensions, bytes as laid out, memory space."""

  dtype: str
  dims: tuple[int, ...]
  nbytes: int
  memory_space: int = 0


@dataclasses.dataclass(frozen=True)
class Op:
  """One op of the program: what it is, what it reads and writes, what it came from."""

  name: str
  opcode: str               # async ops as "<op>-start" / "<op>-done" ("slice-start")
  outputs: tuple[Array, ...]
  operands: tuple[str, ...]  # names of the ops it reads
  op_name: str = ""          # its metadata's op_name (jax's name stack)
  fused_names: tuple[str, ...] = ()    # the op_names of what a fusion holds
  fused_opcodes: frozenset[str] = frozenset()
  target: str = ""           # a custom call's target
  declared_bytes: int = -1   # what a Pallas kernel declares it moves (-1: nothing declared)
  trips: int = 1             # runs per run of the program (its loops' trip counts)
  reads: tuple[int, ...] | None = None  # a fusion's bytes read of each operand (`fused`)
  unwritten: int = 0         # a fusion's results updated in place: bytes not written
  gathers: tuple[str, int, int] = ("", 0, 0)  # a custom fusion's gather or scatter: (op, data
                                               # bytes, index bytes)
  read_bytes: int = 0        # filled in by `with_bytes`
  written_bytes: int = 0

  @property
  def nbytes(self) -> int:
    return self.read_bytes + self.written_bytes

  @property
  def out_bytes(self) -> int:
    return sum(a.nbytes for a in self.outputs)


def array(dtype: str, dims: Iterable[int], minor_to_major: Iterable[int] = (),
          tile: Iterable[int] = (), element_bits: int = 0, memory_space: int = 0) -> Array:
  """An array's bytes as laid out: the first tile pads the minor-most dimensions (in the
  layout's order) to its multiples."""
  dims = tuple(int(d) for d in dims)
  order = list(minor_to_major) or list(range(len(dims) - 1, -1, -1))
  physical = [dims[i] for i in reversed(order)] if len(order) == len(dims) else list(dims)
  tile = list(tile)
  for j in range(1, min(len(tile), len(physical)) + 1):
    if tile[-j] > 0:
      physical[-j] = -(-physical[-j] // tile[-j]) * tile[-j]
  n = 1
  for d in physical:
    n *= d
  bits = element_bits or _ITEM_BITS.get(dtype, 32)
  return Array(dtype, dims, (n * bits + 7) // 8 if dtype != "token" else 0, memory_space)


_TEXT_ARRAY = re.compile(r"(\w+)\[([\d,]*)\](?:\{([^}]*)\})?")


def text_arrays(shape: str) -> tuple[Array, ...]:
  """The arrays of an HLO text shape: 'bf16[33,83]{1,0:T(8,128)(2,1)S(3)}', or a tuple."""
  out = []
  for dtype, dims, layout in _TEXT_ARRAY.findall(shape):
    order, _, rest = (layout or "").partition(":")
    tile = re.match(r"T\(([\d,]+)\)", rest)
    bits, space = re.search(r"E\((\d+)\)", rest), re.search(r"S\((\d+)\)", rest)
    out.append(array(dtype, [int(d) for d in dims.split(",") if d],
                     [int(d) for d in order.split(",") if d],
                     [int(d) for d in tile.group(1).split(",")] if tile else (),
                     int(bits.group(1)) if bits else 0, int(space.group(1)) if space else 0))
  return tuple(out)


def _balanced(s: str, i: int) -> int:
  """The index just past the bracket group opening at s[i]."""
  depth = 0
  for j in range(i, len(s)):
    depth += {"(": 1, "{": 1, ")": -1, "}": -1}.get(s[j], 0)
    if depth == 0:
      return j + 1
  return len(s)


_HEAD = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_COMP = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLED = re.compile(r"\b(?:calls|to_apply|body|condition|branch_computations)=\{?([^}\s,]+"
                     r"(?:,\s*%[\w.\-]+)*)")


class _Line(NamedTuple):
  """One instruction line of HLO text: its name, shape, opcode, operand names, what its
  parentheses hold (a constant's value) and the attributes after them."""

  name: str
  shape: str
  opcode: str
  operands: list[str]
  args: str
  attrs: str


def _text_instruction(line: str) -> _Line | None:
  head = _HEAD.match(line)
  if not head:
    return None
  i = head.end()
  end = _balanced(line, i) if line[i] == "(" else line.index(" ", i)
  op = re.match(r"\s*([\w\-]+)\(", line[end:])
  if not op:
    return None
  start = end + op.end() - 1
  close = _balanced(line, start)
  return _Line(head.group(1), line[i:end], op.group(1),
               re.findall(r"%([\w.\-]+)", line[start:close]), line[start + 1:close - 1],
               line[close:])


_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')


def _op_name(attrs: str) -> str:
  """The metadata's op_name of an instruction's attributes, its escapes undone."""
  m = _OP_NAME.search(attrs)
  return re.sub(r"\\(.)", r"\1", m.group(1)) if m else ""


def declared(backend_config: str) -> int:
  """The bytes a Pallas kernel's backend config declares it accesses; -1: none."""
  m = _DECLARED.search(backend_config)
  return int(m.group(1)) if m else -1


class Fused(NamedTuple):
  """An instruction inside a fusion: name, opcode, arrays, operand names, parameter number
  (-1: not a parameter)."""

  name: str
  opcode: str
  arrays: tuple[Array, ...]
  operands: tuple[str, ...]
  param: int = -1


def _size(arrays: Iterable[Array]) -> int:
  return sum(a.nbytes for a in arrays)


def _param_read(p: Fused, users: list[Fused], by_name: dict[str, Fused]) -> int:
  """What a fusion reads of one operand, as XLA's FusionParameterReadBytes: what slices of
  it take, a dynamic-slice's slice, nothing of a buffer updated in place, the whole
  operand once for every broadcast or reshape of it and once for all its other users."""
  total, seen = 0, False
  for u in users:
    if u.opcode == "slice" or (u.opcode == "dynamic-slice" and u.operands[0] == p.name):
      total += _size(u.arrays)
    elif u.opcode == "dynamic-update-slice" and u.operands[0] == p.name:
      continue
    elif u.opcode in ("broadcast", "reshape"):
      total += _size(p.arrays)
    elif not seen:
      seen, total = True, total + _size(p.arrays)
  return total


def fused(instructions: list[Fused], root: str, custom: bool) -> dict[str, Any]:
  """A fusion's `Op` fields from what it holds: the bytes it reads of each operand, the
  bytes of its results that dynamic-update-slice roots leave unwritten (updated in place),
  and, for a custom fusion, its gather or scatter: (op, what it gathers or its updates, its
  indices)."""
  by_name = {f.name: f for f in instructions}
  users: dict[str, list[Fused]] = {}
  for f in instructions:
    for o in dict.fromkeys(f.operands):
      users.setdefault(o, []).append(f)
  params = sorted((f for f in instructions if f.param >= 0), key=lambda f: f.param)
  top = by_name.get(root)
  outs = ([by_name[o] for o in top.operands if o in by_name] if top and top.opcode == "tuple"
          else [top] if top else [])
  unwritten = sum(_size(r.arrays) - _size(by_name[r.operands[1]].arrays) for r in outs
                  if r.opcode == "dynamic-update-slice" and r.operands[1] in by_name)
  found = ("", 0, 0)
  for f in instructions if custom else ():
    sizes = [_size(by_name[o].arrays) if o in by_name else 0 for o in f.operands]
    if f.opcode == "gather" and len(sizes) > 1:
      found = ("gather", _size(f.arrays), sizes[1])
    elif f.opcode == "scatter" and len(sizes) > 2:
      found = ("scatter", sizes[2], sizes[1])
  return {"fused_opcodes": frozenset(f.opcode for f in instructions), "unwritten": unwritten,
          "reads": tuple(_param_read(p, users.get(p.name, []), by_name) for p in params),
          "gathers": found}


def from_text(text: str) -> list[Op]:
  """The ops of an optimized HLO module's text (see the module's docstring)."""
  comps: dict[str, list[_Line]] = {}
  roots: dict[str, _Line] = {}
  entry, name, current = "", "", None
  for line in text.splitlines():
    if current is None:
      m = _COMP.match(line)
      if m and "=" not in line.split("(")[0]:
        name, current = m.group(2), comps.setdefault(m.group(2), [])
        entry = name if m.group(1) else entry
      continue
    if line.startswith("}"):
      current = None
    elif (ins := _text_instruction(line)) is not None:
      current.append(ins)
      if line.lstrip().startswith("ROOT "):
        roots[name] = ins

  def called(ins: _Line) -> list[str]:
    return [c.strip().lstrip("%") for m in _CALLED.findall(ins.attrs) for c in m.split(",")]

  def op_of(ins: _Line, trips: int) -> Op:
    comp = called(ins)[0] if ins.opcode == "fusion" and called(ins) else ""
    lines = comps.get(comp, [])
    target = re.search(r'custom_call_target="([^"]*)"', ins.attrs)
    more = fused([Fused(i.name, i.opcode, text_arrays(i.shape), tuple(i.operands),
                        int(i.args) if i.opcode == "parameter" else -1) for i in lines],
                 roots[comp].name if comp in roots else "",
                 "kind=kCustom" in ins.attrs) if comp else {}
    return Op(ins.name, ins.opcode, text_arrays(ins.shape), tuple(ins.operands),
              _op_name(ins.attrs), tuple(n for i in lines if (n := _op_name(i.attrs))),
              target=target.group(1) if target else "", declared_bytes=declared(ins.attrs),
              trips=trips, **more)

  def trip_count(ins: _Line) -> int:
    """The N of a loop whose condition's root is `i < N`, N a constant; 1 where it is not."""
    cond = re.search(r"condition=%([\w.\-]+)", ins.attrs)
    lines = {i.name: i for i in comps.get(cond.group(1), [])} if cond else {}
    root = roots.get(cond.group(1)) if cond else None
    limit = lines.get(root.operands[-1]) if root is not None and root.operands else None
    if (root is not None and root.opcode == "compare" and "direction=LT" in root.attrs
        and limit is not None and limit.opcode == "constant" and limit.args.strip().isdigit()):
      return int(limit.args)
    return 1

  def walk(name: str, seen: set[str], trips: int) -> Iterator[Op]:
    for ins in comps.get(name, []):
      if ins.opcode in ("while", "call", "conditional"):
        inner = trips * trip_count(ins) if ins.opcode == "while" else trips
        for c in called(ins):
          if c not in seen:
            yield from walk(c, seen | {c}, inner)
      yield op_of(ins, trips)

  return with_bytes(list(walk(entry, {entry}, 1)))


def with_bytes(ops: list[Op]) -> list[Op]:
  """`ops` with what each reads and writes, by the rules of the module's docstring."""
  out_of = {op.name: op.out_bytes for op in ops}
  done: list[Op] = []
  for op in ops:
    read, written = sum(out_of.get(o, 0) for o in op.operands), op.out_bytes
    if op.opcode in FREE:
      read = written = 0
    elif op.target == PALLAS:
      read, written = max(op.declared_bytes, 0), 0
    elif op.opcode in ("copy-done", "slice-done") or op.target == CONCAT_BITCAST:
      read = 0
    elif op.opcode in ("slice", "dynamic-slice"):
      read = written
    elif op.opcode == "slice-start":  # (operand, slice, context): the slice
      read = written = op.outputs[-2].nbytes if len(op.outputs) > 1 else 0
    elif op.opcode == "dynamic-update-slice" and len(op.operands) > 1:
      read = written = out_of.get(op.operands[1], 0)
    elif op.gathers[0] == "gather":
      written, read = op.gathers[1], op.gathers[1] + op.gathers[2]
    elif op.gathers[0] == "scatter":
      written, read = op.gathers[1], 2 * op.gathers[1] + op.gathers[2]
    elif op.opcode == "fusion":
      written -= op.unwritten
      read = read if op.reads is None else sum(op.reads)
    done.append(dataclasses.replace(op, read_bytes=read, written_bytes=written))
  return done
