"""The pod time model's parts on real published logs and hand-computed collectives (the
calibration that fits its constants: test_calibration.py)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from mlbench import accelerators, rules
from mlbench.pod import collectives, costtable, estimate, predict, timemodel, xlacost

DATA = Path(__file__).parents[1] / "data"
V06 = DATA / "mlperf-v0.6" / "Google" / "results"
V07 = DATA / "mlperf-results" / "v0.7" / "Google" / "results"


def test_from_log_takes_both_formats():
  rule = rules.load("resnet", "0.7.0")
  old = predict.from_log(V06 / "tpu-v3-128" / "resnet" / "result_0.txt", rule, 1_281_167)
  assert old.samples == 64 * 1_281_167
  # The JAX SSD run reached its target at epoch 80; it logged evaluations to epoch 120.
  ssd = predict.from_log(V07 / "tpu-v3-4096-JAX" / "ssd" / "result_0.txt",
                         rules.load("ssd", "0.7.0"), 118_287)
  assert ssd.samples == 80 * 118_287


LINK = collectives.Link(link_bytes_per_s=1e9, hop_latency_s=1e-6)


def test_all_reduce_on_a_4x4_torus_by_hand():
  # Two halves of 1 MB, one starting on each dimension, at once: first 2 phases (reduce-
  # scatter, all-gather) x (3 hops + 3/4 of 500 kB over two counter-rotating rings of
  # 1 GB/s), then the same on the quarter each has left, 125 kB.
  t = collectives.torus((4, 4), pod_dims=(4, 4))
  assert t.wrap == (True, True)
  want = 2 * (3e-6 + 0.75 * 500e3 / 2e9) + 2 * (3e-6 + 0.75 * 125e3 / 2e9)
  assert collectives.all_reduce_s(1e6, t, LINK) == pytest.approx(want)
  # On a ring (one dimension) the whole buffer goes round it.
  assert collectives.all_reduce_s(1e6, collectives.torus((4,), pod_dims=(4,)), LINK) == \
      pytest.approx(2 * (3e-6 + 0.75 * 1e6 / 2e9))


def test_all_reduce_on_a_2x2x2_mesh_without_wraparound_and_across_slices():
  t = collectives.torus((2, 2, 2), pod_dims=None, cube=4)
  assert t.wrap == (False, False, False)
  # Three thirds of 8 MB at once; each phase: 2 x (1 hop + 1/2 of what a third has left
  # over one link).
  want = sum(2 * (1e-6 + 0.5 * b / 3 / 1e9) for b in (8e6, 4e6, 2e6))
  assert collectives.all_reduce_s(8e6, t, LINK) == pytest.approx(want)
  dcn = dataclasses.replace(LINK, dcn_bytes_per_s=1e8, dcn_latency_s=1e-5)
  two = dataclasses.replace(t, slices=2)
  # Then each chip's 1 MB shard across 2 slices: 2 x (1 step + 1/2 of 1 MB at 100 MB/s).
  assert collectives.all_reduce_s(8e6, two, dcn) == pytest.approx(
      want + 2 * (1e-5 + 0.5 * 1e6 / 1e8))
  assert collectives.torus((4, 4, 8), None, cube=4).wrap == (True, True, True)


def _inputs(**kw) -> timemodel.Inputs:
  base = dict(devices=64, global_batch=4096, peak_flops_per_s=100e12, hbm_bytes_per_s=1e12,
              train=timemodel.StepCost(flops=1e12, hbm_bytes=5e9), collective_s=2e-3,
              steps=1000, evals=10, eval_batch_cost=timemodel.StepCost(1e11, 1e9),
              eval_batches=3, model_flops_per_step=64 * 0.9e12)
  return timemodel.Inputs(**{**base, **kw})


def _soft(a: float, b: float) -> float:  # the soft roofline, p = 3
  return (a ** 3 + b ** 3) ** (1 / 3)


def test_the_time_to_train_is_the_sum_of_its_printed_terms():
  c = timemodel.Constants(eta=0.5, hbm=1.0, fixed_flops=1e11, warmup_s=7.0,
                          eval_overhead_s=0.5, kappa=0.5, step_overhead_s=1e-3)
  t = timemodel.predict(_inputs(), c)
  # Compute 1e12 / (1e14 x 0.5) against 5e9 B / 1e12 B/s, plus 1e11 fixed FLOPs at peak.
  assert t.device_step_s == pytest.approx(_soft(0.020, 0.005) + 0.001)
  assert t.fixed_s == pytest.approx(0.001)
  assert (t.compute_s, t.memory_s) == pytest.approx((0.020, 0.005))
  assert t.step_s == pytest.approx(t.device_step_s + 0.5 * 0.002 + 0.001)
  assert t.eval_each_s == pytest.approx(3 * (0.001 + _soft(0.002, 0.001)) + 0.5)
  assert t.total_s == pytest.approx(7.0 + 1000 * t.step_s + 10 * t.eval_each_s)
  assert t.mfu == pytest.approx(0.9e12 / (t.step_s * 100e12)) and not t.input_bound
  slow_host = timemodel.predict(_inputs(input_cpu_s_per_example=0.01, host_cores_per_device=1),
                                c)
  assert slow_host.input_bound and slow_host.step_s == pytest.approx(64 * 0.01)


def test_the_roofline_counts_only_the_bytes_that_grow_with_the_batch():
  step = timemodel.StepCost(flops=1e12, hbm_bytes=50e9)
  # Memory-bound: 50 GB at 1 TB/s x hbm 2 is 25 ms against 10 ms of compute.
  assert step.roofline_s(1e14, 1e12, eta=1.0, hbm=2.0) == pytest.approx(_soft(0.010, 0.025))
  assert 0.025 < step.roofline_s(1e14, 1e12, eta=1.0, hbm=2.0) < 0.025 * 1.03
  # 40 GB of them are the weights' and the update's: 10 GB of activations, 5 ms.
  assert step.roofline_s(1e14, 1e12, 1.0, 2.0, fixed_bytes=40e9) == pytest.approx(
      _soft(0.010, 0.005))
  assert step.roofline_s(1e14, 1e12, 1.0, 2.0, fixed_bytes=80e9) == pytest.approx(0.010)
  c = timemodel.Constants(eta=1.0, hbm=2.0, fixed_flops=0.0, warmup_s=0.0, eval_overhead_s=0.0,
                          fixed_bytes_per_param=40.0)
  x = _inputs(train=step, param_bytes_per_device=1e9, collective_s=0.0)
  assert timemodel.predict(x, c).device_step_s == pytest.approx(_soft(0.010, 0.005))


def test_a_cut_in_bytes_below_the_ridge_moves_the_step_by_the_memory_terms_square_share():
  # Issue 54's reduced BERT-large with the dropout kernel, in the model's terms: compute at
  # eta 25.6 ms, bytes beyond the weights' 11.2 -> 8.2 ms. The HBM bound falls 18%, the
  # device step 1.6% (0.41 ms), about (M / C)^2 of the 3 ms cut.
  c = timemodel.Constants(eta=0.5, hbm=1.0, fixed_flops=0.0, warmup_s=0.0, eval_overhead_s=0.0)
  before = timemodel.predict(_inputs(train=timemodel.StepCost(1.28e12, 11.2e9)), c)
  after = timemodel.predict(_inputs(train=timemodel.StepCost(1.28e12, 8.2e9)), c)
  assert (before.compute_s, before.memory_s, after.memory_s) == pytest.approx(
      (0.0256, 0.0112, 0.0082))
  moved = before.device_step_s - after.device_step_s
  assert moved == pytest.approx(_soft(0.0256, 0.0112) - _soft(0.0256, 0.0082))
  assert 0.2 * 0.003 * (0.0082 / 0.0256) ** 2 < moved < 0.003 * (0.0112 / 0.0256) ** 2
  # Memory-bound (compute at eta 5 ms), the same cut moves it nearly one for one.
  mem = [timemodel.predict(_inputs(train=timemodel.StepCost(0.25e12, b)), c).device_step_s
         for b in (11.2e9, 8.2e9)]
  assert mem[0] - mem[1] > 0.9 * 0.003


def test_cached_compiles_interpolate_in_the_batch():
  records = costtable.load()
  resnet = [r for r in records.values() if r["workload"] == "resnet50"]
  for r in resnet:
    got = costtable.device_cost(records, "resnet50", r["batch"], 1, "train")
    assert got["flops"] == pytest.approx(r["train"]["flops_per_device"])
  if len(resnet) > 1:  # FLOPs are linear in the batch
    lo, hi = sorted(r["batch"] for r in resnet)
    mid = costtable.device_cost(records, "resnet50", (lo + hi) / 2, 1, "train")["flops"]
    ends = [costtable.device_cost(records, "resnet50", b, 1, "train")["flops"] for b in (lo, hi)]
    assert mid == pytest.approx(sum(ends) / 2)


def test_the_eval_batch_is_fitted_to_the_data_axis_and_said():
  from mlbench.config import RunConfig
  from mlbench.pod import check

  rc = RunConfig(workload="bert", config="full")
  fitted, note = check.fit_eval_batch(rc, 4096)
  assert fitted.overrides[-1] == "eval_batch_size=4096" and "does not split over 4,096" in note
  assert check.fit_eval_batch(rc, 512) == (rc, None)  # 1,024 splits over 512
  mine = dataclasses.replace(rc, overrides=("eval_batch_size=8192",))
  assert check.fit_eval_batch(mine, 4096) == (mine, None)  # the user's choice stands


def test_check_reads_the_keys_run_reads():
  """`check` fits the eval batch to the config as `run` reads it (config.configured): the
  harness's own keys (pipeline.microbatches) are no workload config keys."""
  import jax

  from mlbench.config import RunConfig
  from mlbench.pod import check
  from mlbench.train.plan import make_plan
  from mlbench.train.runtime import Runtime

  rc = RunConfig(workload="llama31_8b", mesh=(("stage", 2), ("data", 4)),
                 overrides=("model.scan_layers=true", "pipeline.microbatches=2"))
  assert check.fit_eval_batch(rc, 8) == (rc, None)
  devices = jax.devices()[:8]
  assert make_plan(rc, Runtime(0, 1, devices, devices)).ctx.microbatches == 2


def test_every_tpu_generation_has_an_interconnect_for_the_model():
  for acc in accelerators.table().values():
    assert float(acc.ici["link_bytes_per_s"]) > 0 and acc.host_cores_per_chip > 0, acc.name
  v4 = accelerators.table()["tpu_v4"]
  assert estimate.torus_of(v4, (4, 4, 4)).wrap == (True,) * 3
  assert math.isclose(float(v4.ici["link_bytes_per_s"]) * 6, v4.interconnect_bytes_per_s)


def test_the_module_proto_gives_the_collectives_the_text_gives():
  """On a real TPU program (compiled for a v4 slice, no TPU): protobuf alone reads the
  same collectives from the HLO module proto as the printed text shows."""
  pytest.importorskip("libtpu")
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  from mlbench.pod import hlo, topology

  devices = topology.devices(topology.parse("v4-8"))
  mesh = Mesh(np.array(devices), ("data",))

  def step(w, x):
    return w - jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)

  w = jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=NamedSharding(mesh, P()))
  x = jax.ShapeDtypeStruct((64, 256), jnp.float32, sharding=NamedSharding(mesh, P("data")))
  with jax.default_device(jax.devices("cpu")[0]):
    compiled = jax.jit(step).lower(w, x).compile()
  from_text = hlo.collectives(compiled.as_text(), devices=4)
  proto = compiled.runtime_executable().hlo_modules()[0].as_serialized_hlo_module_proto()
  from_proto = hlo.collectives_from_proto(proto, devices=4)
  assert from_text.count["all-reduce"] >= 1
  assert from_proto.count == from_text.count
  assert from_proto.result_bytes == from_text.result_bytes
  assert from_proto.by_group == from_text.by_group == {4: 256 * 256 * 4}


def test_xlas_estimate_is_none_where_a_pallas_kernel_declares_no_cost():
  """libtpu counts a Pallas kernel without a cost estimate as free (a 512^3 matmul kernel
  and an add cost as the add alone): no estimate then; one that declares its cost is costed
  with it. The module proto gives the same custom calls as the text."""
  pytest.importorskip("libtpu")
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.experimental import pallas as pl
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  from mlbench.pod import topology

  n = 512
  one = NamedSharding(Mesh(np.array(topology.devices(topology.parse("v4-8"))[:1]), ("d",)), P())
  a = jax.ShapeDtypeStruct((n, n), jnp.bfloat16, sharding=one)

  def kernel(a_ref, b_ref, o_ref):
    o_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

  out = {}
  for name, cost in (("none", None), ("declared", pl.CostEstimate(
      flops=2 * n**3, transcendentals=0, bytes_accessed=3 * 4 * n * n))):
    call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((n, n), jnp.float32),
                          cost_estimate=cost)
    with jax.default_device(jax.devices("cpu")[0]):
      compiled = jax.jit(lambda x, y, call=call: call(x, y) + 1).lower(a, a).compile()
    calls = xlacost.custom_calls(compiled.as_text())
    proto = compiled.runtime_executable().hlo_modules()[0].as_serialized_hlo_module_proto()
    assert xlacost.custom_calls_from_proto(proto) == calls
    out[name] = calls, xlacost.estimate(
        xlacost.cost_analysis(compiled).get("optimal_seconds"), calls)
  (calls, none), (declared_calls, declared) = out["none"], out["declared"]
  assert calls == xlacost.CustomCalls(0, 1) and declared_calls == xlacost.CustomCalls(0, 0)
  assert none.seconds is None and none.note.startswith("1 Pallas kernels without a cost")
  assert declared.seconds > 2 * none.raw_seconds > 0  # the kernel's time, left out before


def test_libtpus_minus_one_per_concat_bitcast_is_added_back_and_still_checked():
  ok = xlacost.estimate(-102.965, xlacost.CustomCalls(103))  # ResNet-50's v4-128 train step
  assert ok.seconds == pytest.approx(0.035) and ok.note == ""
  assert xlacost.estimate(-5.0, xlacost.CustomCalls(3)).seconds is None
  # Near 103 a float32 resolves 7.6 us: 2 us left after adding 103 back is no estimate.
  tiny = xlacost.estimate(-102.999998, xlacost.CustomCalls(103))
  assert tiny.seconds is None and "float32" in tiny.note
  assert xlacost.estimate(None, xlacost.CustomCalls(0)).note == "XLA gave none"


def test_xla_messages_on_descriptor_2_are_captured():
  import os

  from mlbench.pod import quiet

  with quiet.captured() as noise:
    os.write(2, b"E1125 21:15:59.654682 7669 status_macros.cc:58] INTERNAL: RET_CHECK failure "
                b"(hlo_instruction.cc:390) async-update instruction should have 1 operands\n"
                b"*** Begin stack trace ***\n")
  assert "Begin stack trace" in noise.text
  assert noise.first_error().startswith("INTERNAL: RET_CHECK failure")


def test_a_train_step_without_readable_collectives_still_gets_mfu_and_a_prediction():
  """What check does when XLA can print neither the program nor its proto: MFU from
  the analytic FLOPs, the gradient all-reduce from the slice's torus, a time to train."""
  pytest.importorskip("libtpu")
  from mlbench.config import RunConfig
  from mlbench.pod import check, topology
  from mlbench.train.plan import make_plan

  slice_ = topology.parse("v4-128")
  runtime = topology.runtime(slice_)
  rc = RunConfig(workload="bert", config="full", mesh=(("data", 16), ("model", 4)))
  rc, _ = check.fit_eval_batch(rc, len(runtime.devices))
  plan = make_plan(rc, runtime, machine=topology.machine(slice_, runtime.devices))
  unknown = dict(name="train step", flops=None, argument_bytes=0, output_bytes=0, alias_bytes=0,
                 temp_bytes=0, code_bytes=0, collectives={}, bytes_accessed=None,
                 hlo_readable=False, collective_source="unknown", xla_error="RET_CHECK ...")
  reports = (check.ProgramReport(**unknown), check.ProgramReport(**{**unknown, "name": "eval"}))
  model_flops = 6.1e12 * plan.gbs
  p = check._predict(plan, slice_.accelerator, reports, grad_bytes=1.4e9 / 2,
                     model_flops=model_flops, convergence=predict.Convergence(3e6, "test"))
  assert p.terms is not None and p.time_to_train_s == pytest.approx(p.terms.total_s)
  assert p.mfu == pytest.approx(model_flops / (p.step_s * 64 * 275e12))
  assert p.roofline.collective_s > 0  # the gradient all-reduce over the data axis's chips
  assert not p.collectives_known  # the model axis's are not in the terms, and check says so
  # XLA counts a while loop's body once: a scanned stack of 12 reads as 1/12 of its FLOPs.
  # The model FLOPs are the floor, as where XLA gives none (gpt_oss_20b's read 245% MFU).
  scanned = tuple(check.ProgramReport(**{**unknown, "name": n, "flops": model_flops / 12})
                  for n in ("train step", "eval"))
  q = check._predict(plan, slice_.accelerator, scanned, grad_bytes=1.4e9 / 2,
                     model_flops=model_flops, convergence=predict.Convergence(3e6, "test"))
  assert q.roofline.compute_s == pytest.approx(p.roofline.compute_s)
  assert q.step_s == pytest.approx(p.step_s) and q.mfu < 1
  # Its bytes likewise: the body's repeat trips (read from the program's loops) count.
  from mlbench.pod import hbm

  once = dict(unknown, flops=model_flops, bytes_accessed=4e9)
  looped = dict(once, hbm=hbm.Breakdown(total=4e9, parts={}, in_layers={}, layers=0,
                                        loop_repeats=11 * 4e9))
  r, s = (check._predict(plan, slice_.accelerator,
                         tuple(check.ProgramReport(**{**d, "name": n}) for n in ("train step",
                                                                                 "eval")),
                         grad_bytes=1.4e9 / 2, model_flops=model_flops,
                         convergence=predict.Convergence(3e6, "test")) for d in (once, looped))
  assert s.roofline.hbm_s == pytest.approx(12 * r.roofline.hbm_s)
