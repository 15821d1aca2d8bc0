"""Every op of a compiled program's HloModuleProto, as `hloops` reads them from the text.

For the programs XLA cannot print (jaxlib fails to re-read some that libtpu writes:
"async-update instruction should have 1 operands"); read with protobuf alone
(`hlo.module_proto`). An async op is named by the op it wraps, as the text names it
(`slice-start`, `slice-done`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from mlbench.pod import hloops
from mlbench.pod.hloops import Array, Op

# xla_data.proto's PrimitiveType numbers, by name.
_PROTO_TYPE = {1: "pred", 2: "s8", 3: "s16", 4: "s32", 5: "s64", 6: "u8", 7: "u16", 8: "u32",
               9: "u64", 10: "f16", 11: "f32", 12: "f64", 15: "c64", 16: "bf16", 18: "c128",
               21: "s4", 22: "u4"}


def arrays(shape: Any) -> tuple[Array, ...]:
  """The arrays of a ShapeProto (a tuple gives several), as laid out."""
  if shape.tuple_shapes:
    return tuple(a for s in shape.tuple_shapes for a in arrays(s))
  dtype = _PROTO_TYPE.get(int(shape.element_type))
  if dtype is None:
    return ()
  lay = shape.layout
  return (hloops.array(dtype, shape.dimensions, lay.minor_to_major,
                       lay.tiles[0].dimensions if lay.tiles else (), lay.element_size_in_bits,
                       lay.memory_space),)


def ops(module: Any) -> list[Op]:
  """The ops of an HloModuleProto, as `hloops.from_text` reads them from the text."""
  comps = {c.id: c for c in module.computations}
  by_id = {i.id: i for c in module.computations for i in c.instructions}

  def fusion(ins: Any) -> dict[str, Any]:
    comp = comps[ins.called_computation_ids[0]]
    more = hloops.fused([hloops.Fused(i.name, i.opcode, arrays(i.shape),
                                      tuple(by_id[o].name for o in i.operand_ids),
                                      i.parameter_number if i.opcode == "parameter" else -1)
                         for i in comp.instructions], by_id[comp.root_id].name,
                        ins.fusion_kind == "kCustom")
    return {**more, "fused_names": tuple(i.metadata.op_name for i in comp.instructions
                                         if i.metadata.op_name)}

  def op_of(ins: Any, trips: int) -> Op:
    opcode = ins.opcode
    start = by_id[ins.operand_ids[0]] if opcode == "async-done" else ins
    if opcode in ("async-start", "async-done") and start.called_computation_ids:
      root = by_id[comps[start.called_computation_ids[0]].root_id]
      opcode = root.opcode + opcode.removeprefix("async")
    return Op(ins.name, opcode, arrays(ins.shape), tuple(by_id[o].name for o in ins.operand_ids),
              ins.metadata.op_name, target=ins.custom_call_target,
              declared_bytes=hloops.declared(ins.backend_config.decode("utf-8", "replace")),
              trips=trips, **(fusion(ins) if ins.opcode == "fusion" else {}))

  def trip_count(ins: Any) -> int:
    """The N of a condition whose root is `i < N`, N a constant; 1 where it is not."""
    for cid in ins.called_computation_ids:
      c = by_id[comps[cid].root_id]
      if (c.opcode == "compare" and c.comparison_direction == "LT" and len(c.operand_ids) == 2
          and by_id[c.operand_ids[1]].opcode == "constant"):
        values = list(by_id[c.operand_ids[1]].literal.s32s)
        return int(values[0]) if values else 1
    return 1

  def walk(cid: int, trips: int) -> Iterator[Op]:
    for ins in comps[cid].instructions:
      if ins.opcode in ("while", "call", "conditional"):
        inner = trips * trip_count(ins) if ins.opcode == "while" else trips
        for c in ins.called_computation_ids:
          yield from walk(c, inner)
      yield op_of(ins, trips)

  return hloops.with_bytes(list(walk(module.entry_computation_id, 1)))
