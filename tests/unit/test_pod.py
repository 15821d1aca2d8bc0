"""The pod wing without a TPU: slice names, collectives in HLO text, the prediction."""

from __future__ import annotations

import pytest

from mlbench import accelerators, rules
from mlbench.errors import UserError
from mlbench.pod import hlo, predict, topology


@pytest.mark.parametrize("name, chips, topo", [
    ("v3-2048", 1024, "v3:32x32"), ("v3-8192", 4096, "v3:32x128"), ("v4-128", 64, "v4:4x4x4"),
    ("v5p-256", 128, "v5p:4x4x8"), ("v6e-64", 64, "v6e:8x8"), ("v5litepod-16", 16, "v5e:4x4"),
    ("v5e-1", 1, "v5e:1x1"), ("v2-512", 256, "v2:16x16")])
def test_cloud_tpu_slice_names_map_to_topologies(name, chips, topo):
  s = topology.parse(name)
  assert (s.chips, s.topology_name) == (chips, topo)


@pytest.mark.parametrize("name", ["v4-100", "v7-8", "tpu", "v2-8192"])
def test_an_unknown_slice_lists_the_valid_names(name):
  with pytest.raises(UserError, match="unknown TPU slice") as e:
    topology.parse(name)
  assert "v4-128" in str(e.value) and "v6e-256" in str(e.value)


HLO = """
  %p.1 = bf16[64,1024]{1,0:T(8,128)(2,1)} parameter(0)
  %w.2 = bf16[1024,4096]{1,0:T(8,128)(2,1)} parameter(1)
  %dot.3 = f32[64,4096]{1,0} dot(%p.1, %w.2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %all-reduce.2 = bf16[1024,2048]{1,0:T(8,128)(2,1)} all-reduce(%input), channel_id=2, replica_groups={{0,2,4,6},{1,3,5,7}}, to_apply=%add
  %ags = (f32[16]{0:T(256)}, f32[64]{0:T(256)}) all-gather-start(%p), replica_groups=[2,4]<=[8], dimensions={0}
  %agd = f32[64]{0} all-gather-done(%ags)
  ROOT %cp = (f32[8]{0}, f32[8]{0}, u32[], u32[]) collective-permute-start(%x), source_target_pairs={{0,1},{1,0}}
"""


def test_collectives_count_bytes_and_ring_traffic():
  c = hlo.collectives(HLO, devices=8)
  assert c.count == {"all-reduce": 1, "reduce-scatter": 0, "all-gather": 1, "all-to-all": 0,
                     "collective-permute": 1}
  assert c.result_bytes["all-reduce"] == 1024 * 2048 * 2
  # A ring all-reduce over 4 devices sends 2 * 3/4 of the buffer from each.
  assert c.wire_bytes["all-reduce"] == pytest.approx(1.5 * 1024 * 2048 * 2)
  assert c.result_bytes["all-gather"] == 64 * 4  # The gathered result, not the operand.
  assert c.wire_bytes["all-gather"] == pytest.approx(0.75 * 64 * 4)


def test_matmul_input_dtypes_follow_the_operands():
  assert hlo.matmul_input_dtypes(HLO) == {"bf16": 1}


def test_the_prediction_is_the_largest_bound_and_implies_mfu():
  v4 = accelerators.table()["tpu_v4"]
  roof = predict.roofline(v4, flops_per_device=275e12 * 0.010, bytes_per_device=1.2e12 * 0.004,
                          wire_bytes_per_device=270e9 * 0.002)
  assert roof.compute_s == pytest.approx(0.010) and roof.limit == "compute"
  p = predict.predict(v4, devices=64, global_batch=4096, roof=roof, xla_step_s=0.008,
                      model_flops_per_step=64 * 275e12 * 0.005,
                      convergence=predict.Convergence(samples=4096 * 1000, source="test"))
  assert p.step_s == pytest.approx(0.010) and p.samples_per_s == pytest.approx(409_600)
  assert p.mfu == pytest.approx(0.5)
  assert p.steps_to_converge == pytest.approx(1000) and p.time_to_train_s == pytest.approx(10.0)


def test_reference_convergence_points_interpolate_in_batch_size():
  bert = rules.load("bert", "4.0.0")
  lo = predict.from_rcps(bert, 256, 1)
  hi = predict.from_rcps(bert, 4096, 1)
  assert 2e6 < lo.samples < 3e6 and hi.samples > lo.samples  # Bigger batches need more samples.
  assert "4.0.0" in hi.source
  resnet = rules.load("resnet", "0.7.0")  # v0.7 shipped no RCPs: the first later round's.
  c = predict.from_rcps(resnet, 4096, 1_281_167)
  assert 30 * 1_281_167 < c.samples < 50 * 1_281_167 and "1.0.0" in c.source
  assert predict.from_rcps(rules.load("resnet", "mini"), 64, 1000) is None


def test_a_result_log_gives_the_samples_to_converge(write_log, tmp_path):
  log = write_log(tmp_path / "result_0.txt", [0.5, 0.9, 0.99])
  c = predict.from_log(log, rules.load("resnet", "mini"), train_examples=1000)
  assert c.samples == 12 * 1000  # Converged at the third evaluation, epoch 12.
  failed = write_log(tmp_path / "result_1.txt", [0.5], status_success=False)
  with pytest.raises(UserError, match="not a successful run"):
    predict.from_log(failed, rules.load("resnet", "mini"), train_examples=1000)


def test_the_does_not_fit_hint_names_remat_only_where_the_config_has_it():
  import dataclasses

  from mlbench.pod import oom
  from workloads.bert import config as bert_config
  from workloads.llama31_8b import config as llama_config
  from workloads.resnet50 import config as resnet_config

  assert oom.remat_hint(resnet_config.full()) == ""  # ResNet-50 has no model.remat key
  assert oom.remat_hint(bert_config.full()) == ", remat (--set model.remat=full)"
  assert oom.remat_hint(llama_config.full()) == ""  # already full remat
  no_remat = llama_config.mini()
  assert no_remat.model.remat is llama_config.Remat.NONE
  assert oom.remat_hint(no_remat) == ", remat (--set model.remat=full)"
  dots = dataclasses.replace(no_remat, model=dataclasses.replace(
      no_remat.model, remat=llama_config.Remat.DOTS))
  assert "model.remat=full" in oom.remat_hint(dots)
