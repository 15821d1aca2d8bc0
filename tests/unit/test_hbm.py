"""Where a train step's bytes go (mlbench/pod/hloops.py, hbm.py): the ops of an optimized
HLO module, the bytes each moves as XLA counts them, and their kinds."""

from __future__ import annotations

import pytest

from mlbench.pod import hbm, hloops

# A TPU program's shapes (tiled layouts, a prefetch into another memory space, a sliced
# prefetch joined by ConcatBitcast, an eviction to the outputs), the names jax writes.
TEXT = r"""HloModule jit_step, is_scheduled=true

%fused_computation.1 (param_0: bf16[33,1000], param_1.2: f32[1000,3000]) -> bf16[33,3000] {
  %param_0 = bf16[33,1000]{1,0:T(8,128)(2,1)} parameter(0)
  %param_1.2 = f32[1000,3000]{1,0:T(8,128)} parameter(1)
  %convert.1 = bf16[1000,3000]{1,0:T(8,128)(2,1)} convert(%param_1.2), metadata={op_name="jit(step)/jvp(Model)/layer_0/mlp/dense/convert_element_type"}
  ROOT %convolution.1 = bf16[33,3000]{1,0:T(8,128)(2,1)} convolution(%param_0, %convert.1), dim_labels=bf_io->bf, metadata={op_name="jit(step)/jvp(Model)/layer_0/mlp/dense/dot_general"}
}

%fused_computation.2 (param_0.1: f32[1024,1024], param_1.1: f32[1024,1024]) -> f32[1024,1024] {
  %param_0.1 = f32[1024,1024]{1,0:T(8,128)} parameter(0)
  %param_1.1 = f32[1024,1024]{1,0:T(8,128)} parameter(1)
  ROOT %add.1 = f32[1024,1024]{1,0:T(8,128)} add(%param_0.1, %param_1.1), metadata={op_name="jit(step)/add"}
}

%fused_computation.3 (param_0.3: bf16[2,128,16,64]) -> bf16[2,16,128,128] {
  %param_0.3 = bf16[2,128,16,64]{3,2,1,0:T(8,128)(2,1)} parameter(0)
  ROOT %broadcast.3 = bf16[2,16,128,128]{3,2,1,0:T(8,128)(2,1)} broadcast(%param_0.3), dimensions={0,2,1}
}

%body (arg: (s32[], f32[8])) -> (s32[], f32[8]) {
  %arg = (s32[], f32[8]{0}) parameter(0)
  %gte.9 = f32[8]{0} get-tuple-element(%arg), index=1
  %add.9 = f32[8]{0} add(%gte.9, %gte.9), metadata={op_name="jit(step)/jvp(Model)/layer_1/mlp/add"}
  %gte.8 = s32[] get-tuple-element(%arg), index=0
  ROOT %tuple.9 = (s32[], f32[8]{0}) tuple(%gte.8, %add.9)
}

%cond (arg.1: (s32[], f32[8])) -> pred[] {
  %arg.1 = (s32[], f32[8]{0}) parameter(0)
  %constant.2 = s32[]{:T(128)} constant(3)
  %gte.7 = s32[]{:T(128)} get-tuple-element(%arg.1), index=0
  ROOT %lt.1 = pred[]{:T(512)} compare(%gte.7, %constant.2), direction=LT
}

ENTRY %main.1_spmd (param.1: f32[1000,3000], param: bf16[33,1000]) -> (f32[1024,1024]) {
  %param.1 = f32[1000,3000]{1,0:T(8,128)} parameter(0), metadata={op_name="params['w']"}
  %param = bf16[33,1000]{1,0:T(8,128)(2,1)} parameter(1), metadata={op_name="sums[\'nsp_loss\']"}
  %param.2 = f32[1024,1024]{1,0:T(8,128)} parameter(2)
  %param.3 = f32[1024,1024]{1,0:T(8,128)} parameter(3)
  %q = bf16[2,128,16,64]{3,2,1,0:T(8,128)(2,1)} parameter(4)
  %copy-start = (f32[1000,3000]{1,0:T(8,128)S(3)}, f32[1000,3000]{1,0:T(8,128)}, u32[]{:S(2)}) copy-start(%param.1), cross_program_prefetch_index=0
  %copy-done = f32[1000,3000]{1,0:T(8,128)S(3)} copy-done(%copy-start)
  %fusion.1 = bf16[33,3000]{1,0:T(8,128)(2,1)} fusion(%param, %copy-done), kind=kOutput, calls=%fused_computation.1, metadata={op_name="jit(step)/jvp(Model)/layer_0/mlp/dense/dot_general"}
  %slice-start.1 = ((f32[1024,1024]{1,0:T(8,128)}), f32[512,1024]{1,0:T(8,128)S(3)}, s32[]{:S(2)}) slice-start(%param.2), slice={[0:512], [0:1024]}
  %slice-start.2 = ((f32[1024,1024]{1,0:T(8,128)}), f32[512,1024]{1,0:T(8,128)S(3)}, s32[]{:S(2)}) slice-start(%param.2), slice={[512:1024], [0:1024]}
  %slice-done.1 = f32[512,1024]{1,0:T(8,128)S(3)} slice-done(%slice-start.1)
  %slice-done.2 = f32[512,1024]{1,0:T(8,128)S(3)} slice-done(%slice-start.2)
  %custom-call.1 = f32[1024,1024]{1,0:T(8,128)S(3)} custom-call(%slice-done.1, %slice-done.2), custom_call_target="ConcatBitcast"
  %update = f32[1024,1024]{1,0:T(8,128)} fusion(%custom-call.1, %param.3), kind=kLoop, calls=%fused_computation.2, metadata={op_name="jit(step)/add"}
  %scores = bf16[2,16,128,128]{3,2,1,0:T(8,128)(2,1)} fusion(%q), kind=kLoop, calls=%fused_computation.3, metadata={op_name="jit(step)/jvp(Model)/layer_0/attention/div"}
  %mask = f32[2,128,128]{2,1,0:T(8,128)} fusion(%q), kind=kLoop, calls=%fused_computation.3, metadata={op_name="jit(step)/jvp(Model)/layer_0/attention/jit(_where)/select_n"}
  %bits = u32[2,16,128,128]{3,2,1,0} fusion(%q), kind=kLoop, calls=%fused_computation.3, metadata={op_name="jit(step)/jvp(Model)/layer_0/attention/Dropout_0/jit(_bernoulli)/jit(_uniform)/shift_right_logical"}
  %kernel = bf16[2,128,16,64]{3,2,1,0:T(8,128)(2,1)} custom-call(%q), custom_call_target="tpu_custom_call", metadata={op_name="jit(step)/jvp(Model)/layer_0/attention/pallas_call"}, backend_config="{\"custom_call_config\": {}, \"cost_estimate\": {\"bytes_accessed\":5000,\"flops\":1}}"
  %free = bf16[2,128,16,64]{3,2,1,0:T(8,128)(2,1)} custom-call(%q), custom_call_target="tpu_custom_call", metadata={op_name="jit(step)/jvp(Model)/layer_0/attention/pallas_call"}, backend_config="{\"custom_call_config\": {}}"
  %nll = f32[33]{0:T(128)} fusion(%q), kind=kLoop, calls=%fused_computation.3, metadata={op_name="jit(step)/jvp()/reduce_sum"}
  %all-reduce.1 = f32[1024,1024]{1,0:T(8,128)} all-reduce(%update), channel_id=1, replica_groups={{0,1}}, to_apply=%cond
  %init = (s32[], f32[8]{0}) tuple(%param, %param)
  %while.1 = (s32[], f32[8]{0}) while(%init), condition=%cond, body=%body
  %copy-start.2 = (f32[1024,1024]{1,0:T(8,128)}, f32[1024,1024]{1,0:T(8,128)S(3)}, u32[]{:S(2)}) copy-start(%update)
  %copy-done.2 = f32[1024,1024]{1,0:T(8,128)} copy-done(%copy-start.2)
  %bitcast.1 = f32[1024,1024]{1,0:T(8,128)} bitcast(%copy-done.2)
  ROOT %tuple.1 = (f32[1024,1024]{1,0:T(8,128)}, f32[1024,1024]{1,0:T(8,128)}) tuple(%bitcast.1, %all-reduce.1)
}
"""

W = 1000 * 3072 * 4   # f32[1000,3000] tiled (8,128): the minor dimension padded to 3072
X = 40 * 1024 * 2     # bf16[33,1000]: 33 rows padded to 40, 1000 columns to 1024
Y = 40 * 3072 * 2
M = 1024 * 1024 * 4


def test_ops_move_what_xlas_cost_analysis_counts():
  ops = {op.name: op for op in hloops.from_text(TEXT)}
  # The entry's ops and a loop body's, once each; fused ops stay inside their fusion.
  assert "add.9" in ops and "convolution.1" not in ops and "arg" in ops
  assert ops["param"].op_name == "sums['nsp_loss']" and ops["param"].nbytes == 0
  assert (ops["fusion.1"].read_bytes, ops["fusion.1"].written_bytes) == (X + W, Y)
  assert ops["fusion.1"].fused_opcodes >= {"convolution", "convert"}
  assert ("jit(step)/jvp(Model)/layer_0/mlp/dense/convert_element_type"
          in ops["fusion.1"].fused_names)
  # A prefetch: copy-start reads its operand and writes its whole result (destination,
  # source, context); copy-done writes its result.
  assert (ops["copy-start"].read_bytes, ops["copy-start"].written_bytes) == (W, 2 * W + 4)
  assert (ops["copy-done"].read_bytes, ops["copy-done"].written_bytes) == (0, W)
  # A sliced prefetch reads and writes its slice; ConcatBitcast writes what it joins.
  assert (ops["slice-start.1"].read_bytes, ops["slice-start.1"].written_bytes) == (M // 2,) * 2
  assert (ops["slice-done.1"].read_bytes, ops["slice-done.1"].written_bytes) == (0, M // 2)
  assert (ops["custom-call.1"].read_bytes, ops["custom-call.1"].written_bytes) == (0, M)
  assert ops["all-reduce.1"].nbytes == 2 * M and ops["add.9"].nbytes == 3 * 32
  # A Pallas kernel moves what it declares; one declaring nothing is free, as XLA counts it.
  assert (ops["kernel"].nbytes, ops["free"].nbytes) == (5000, 0)
  assert all(ops[n].nbytes == 0 for n in ("tuple.1", "bitcast.1", "param.2", "gte.9", "init",
                                          "while.1"))
  # The loop's body runs 3 times (its condition: i < 3); XLA counts it once.
  assert ops["add.9"].trips == 3 and ops["fusion.1"].trips == 1


def test_each_op_gets_a_kind_and_the_parts_add_up_to_xlas_total():
  ops = hloops.from_text(TEXT)
  counted = sum(op.nbytes for op in ops)
  b = hbm.breakdown(ops, counted + 1000.0)
  assert sum(b.parts.values()) == pytest.approx(b.total) and b.total == counted + 1000.0
  assert b.parts[hbm.UNATTRIBUTED] == pytest.approx(1000.0)
  by = {op.name: op.nbytes for op in ops}
  prefetch = by["copy-start"] + by["copy-done"]
  # The weight's prefetch serves the matmul that reads it; the sliced prefetch the update
  # (outside the differentiated loss: the optimizer); the eviction of the update to the
  # outputs takes the kind of the op that wrote it.
  assert b.parts[hbm.MATMULS] == by["fusion.1"] + prefetch
  sliced = sum(by[n] for n in ("slice-start.1", "slice-start.2", "slice-done.1",
                               "slice-done.2", "custom-call.1"))
  assert b.parts[hbm.OPTIMIZER] == by["update"] + sliced + by["copy-start.2"] + by["copy-done.2"]
  assert b.parts[hbm.ATTENTION] == by["scores"] + 5000 and b.parts[hbm.MASKS] == by["mask"]
  assert b.parts[hbm.RANDOM_BITS] == by["bits"] and b.parts[hbm.HEADS] == by["nll"]
  assert b.parts[hbm.COLLECTIVES] == by["all-reduce.1"]
  assert b.parts[hbm.ELEMENTWISE] == by["add.9"]
  assert b.between_memories == prefetch + sliced + by["copy-start.2"] + by["copy-done.2"]
  # By memory space: what the ops read and write there adds up to their sum; the
  # prefetched weight is written to and read from space 3 (copy-done, the matmul).
  assert sum(b.by_memory_space.values()) == pytest.approx(counted)
  assert b.by_memory_space[3] > 2 * W and b.by_memory_space[0] > by["update"]
  # Numbered layers: layer_0's ops and the prefetch its matmul reads, layer_1's add.
  assert b.layers == 2
  assert sum(b.in_layers.values()) == (by["fusion.1"] + prefetch + by["scores"] + 5000
                                       + by["mask"] + by["bits"] + by["add.9"])
  assert b.top[0].name == "copy-start" and b.top[0].kind == hbm.MATMULS
  assert b.loop_repeats == 2 * (by["add.9"] + by["lt.1"])  # the body and the condition


def test_without_xlas_total_nothing_is_unattributed():
  b = hbm.breakdown(hloops.from_text(TEXT), None)
  assert b.parts[hbm.UNATTRIBUTED] == 0 and b.total == sum(b.parts.values())


@pytest.mark.parametrize("shape, nbytes", [
    ("bf16[33,83]{1,0:T(8,128)(2,1)}", 40 * 128 * 2),
    ("f32[1024,2]{0,1:T(2,128)}", 2 * 1024 * 4),   # the layout's minor dimension is 1024
    ("f32[3000]{0:T(1024)}", 3072 * 4),
    ("s4[64]{0:E(4)}", 32),
    ("f32[7,5]{1,0}", 140),                          # no tiles: as written
    ("(f32[2]{0}, u32[]{:S(2)})", 8 + 4),
])
def test_arrays_take_the_bytes_their_layout_takes(shape, nbytes):
  assert sum(a.nbytes for a in hloops.text_arrays(shape)) == nbytes


def test_the_module_proto_reads_as_the_text_does():
  """Where XLA cannot print a program (libtpu's v5p programs), its proto gives the same ops."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp

  from mlbench.pod import hlo, hloproto

  class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = nn.LayerNorm(name="norm")(nn.Dense(64, name="dense")(x))
      return nn.Dropout(0.1, deterministic=False)(x)

  def step(params, x, rng):
    def loss(p):
      return jnp.mean(Block().apply(p, x, rngs={"dropout": rng}) ** 2)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, jax.grad(loss)(params))

  x = jnp.ones((8, 32))
  params = Block().init({"params": jax.random.key(0), "dropout": jax.random.key(1)}, x)
  compiled = jax.jit(step).lower(params, x, jax.random.key(2)).compile()
  proto = compiled.runtime_executable().hlo_modules()[0].as_serialized_hlo_module_proto()

  def key(ops):
    return sorted((o.name, o.opcode, o.read_bytes, o.written_bytes, o.op_name,
                   sorted(o.fused_names), o.operands) for o in ops)

  from_text = hloops.from_text(compiled.as_text())
  assert key(hloproto.ops(hlo.module_proto(proto))) == key(from_text)
  assert any("dense" in o.op_name for o in from_text)
