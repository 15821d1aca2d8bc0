"""The time model's calibration (benchmarks/calibration, outside the package): what it reads
of published logs, that its fit finds known constants, and that the constants the package
carries (mlbench/accelerators.yaml) are its fit of today's logs and compiles."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from benchmarks.calibration import cases, costs, fit, runlog
from mlbench.pod import estimate, timemodel, uncertainty

DATA = Path(__file__).parents[1] / "data"
V06 = DATA / "mlperf-v0.6" / "Google" / "results"
V07 = DATA / "mlperf-results" / "v0.7" / "Google" / "results"


def test_the_old_mll_format_is_read_from_a_published_v06_log():
  r = runlog.read(V06 / "tpu-v3-128" / "resnet" / "result_0.txt")
  assert r.old_format and r.success and r.benchmark == "resnet" and r.platform == "tpu-v3-128"
  assert r.global_batch_size == 16384 and r.train_examples == 1_281_167
  assert r.run_s == pytest.approx(1558516333.791 - 1558515660.674)  # run_start..run_stop
  assert r.evals == 16 and r.samples == 64 * 1_281_167  # the last eval at epoch 64
  # 16 blocks of 4 epochs, about 41 s each: 4 x 1,281,167 / 16,384 = 312.8 steps a block.
  assert r.sound_step_s() == pytest.approx(41.0 / (4 * 1_281_167 / 16384), rel=0.01)


def test_mllog_lines_and_a_run_start_logged_before_init_stop():
  jax_bert = runlog.read(V07 / "tpu-v3-8192-JAX" / "bert" / "result_0.txt")
  assert not jax_bert.old_format and jax_bert.global_batch_size == 8192
  assert jax_bert.samples == jax_bert.steps * 8192 and 400 < jax_bert.steps < 700  # v0.7: steps
  # The TF SSD log stamps run_start 15 hours before init_stop; its blocks start at init_stop.
  ssd = runlog.read(V07 / "tpu-v3-8192-TF" / "ssd" / "result_0.txt")
  assert 20 < ssd.run_s < 40 and ssd.sound_step_s() is None  # async blocks: not sound


def test_evaluations_logged_after_run_stop_are_not_the_runs():
  """SSD scores COCO on the host while training goes on: the v0.7 JAX run's target eval
  (epoch 80) comes back at epoch 112, and it logs eight more evaluations of training
  after run_stop; the v0.6 TF run logs its epoch-65 evaluation after run_stop too."""
  jax_ssd = runlog.read(V07 / "tpu-v3-4096-JAX" / "ssd" / "result_0.txt", 118_287)
  assert jax_ssd.evals == 8  # epochs 40 and 50 to 80
  assert jax_ssd.samples == 112 * 118_287  # the 112 one-epoch blocks done by run_stop
  v06 = runlog.read(V06 / "tpu-v3-256" / "ssd" / "result_0.txt", 117_266)
  assert v06.evals == 5 and v06.samples == 59 * 117_266


@pytest.fixture(scope="module")
def tpu_rows():
  rows, _ = fit.rows(tuple(c for c in cases.CASES if not c.held_out), cases.default_results())
  if len(rows) < 20:
    pytest.skip("the published logs (shared/mlperf-results) are not beside this checkout")
  return rows


def test_the_fit_recovers_known_constants_and_leave_one_out_predicts_each_run(tpu_rows,
                                                                           monkeypatch):
  """Rows of real calibration cases whose 'measured' times come from known constants (the
  warm-ups the logs show, which the fit measures rather than fits): every fittable
  constant fitted; then the chosen three (the others held at their start)."""
  monkeypatch.setattr(fit, "FITTED", timemodel.Constants.FITTED)
  default, by = fit.warmups(tpu_rows)
  assert dict(by)["resnet50"] > 1 and len(by) == 4  # ResNet-50 fills its input pipeline
  true = timemodel.Constants(eta=0.45, hbm=1.2, fixed_flops=3e11, warmup_s=default,
                             warmup_by=by, eval_overhead_s=0.4, kappa=0.7,
                             fixed_bytes_per_param=40.0)
  fake = [dataclasses.replace(r, measured=dataclasses.replace(
      r.measured, run_s=timemodel.predict(r.inputs, true).total_s)) for r in tpu_rows]
  got = fit.fit(fake, dataclasses.replace(true, eta=0.6, hbm=1.0, fixed_flops=1e11,
                                          eval_overhead_s=0.1, kappa=1.0,
                                          fixed_bytes_per_param=30.0))
  assert fit.spread([timemodel.predict(r.inputs, got).total_s / r.measured.run_s
                     for r in fake])["worst"] < 1.01
  assert got.eta == pytest.approx(0.45, rel=0.05)
  assert got.fixed_flops == pytest.approx(3e11, rel=0.2)
  assert got.kappa == pytest.approx(0.7, abs=0.1)
  assert got.warmup_by == by
  # The GPU efficiency, per workload: two runs of each, each predicted by the other's.
  pairs = [
      r for wl in ("resnet50", "bert") for r in [x for x in fake if x.inputs.workload == wl][:2]]
  gpu_like = [dataclasses.replace(r, inputs=dataclasses.replace(r.inputs, accelerator="h100"))
              for r in pairs]
  assert fit.spread(fit.leave_one_out(gpu_like, got, only_eta=True))["worst"] < 1.02
  per = fit.fit(gpu_like, start=dataclasses.replace(got, eta=0.3), only_eta=True)
  assert dict(per.eta_by)["h100/bert"] == pytest.approx(0.45, rel=0.01)
  assert per.eta_for("h100", "resnet50") == pytest.approx(0.45, rel=0.01)
  monkeypatch.setattr(fit, "FITTED", ("eta", "hbm", "fixed_flops"))
  held = dataclasses.replace(true, eval_overhead_s=0.0, kappa=1.0, fixed_bytes_per_param=42.9)
  fake = [dataclasses.replace(r, measured=dataclasses.replace(
      r.measured, run_s=timemodel.predict(r.inputs, held).total_s)) for r in tpu_rows]
  got = fit.fit(fake, dataclasses.replace(held, eta=0.6, hbm=1.0, fixed_flops=1e11))
  assert (got.eval_overhead_s, got.kappa, got.fixed_bytes_per_param) == (0.0, 1.0, 42.9)
  assert got.eta == pytest.approx(0.45, rel=0.02) and got.hbm == pytest.approx(1.2, rel=0.05)


def test_the_stored_tpu_constants_are_the_fit_of_the_calibration_set(tpu_rows):
  """accelerators.yaml holds what `python -m benchmarks.calibration.fit --write` fits today:
  a change to the model, the logs or the compiles that moves the fit must refit and store
  it."""
  stored, provenance = estimate.constants("tpu")
  got = fit.fit(tpu_rows, fit.base_constants())
  for name in ("eta", "hbm", "fixed_flops", "fixed_bytes_per_param"):
    assert getattr(stored, name) == pytest.approx(getattr(got, name), rel=0.01), name
  assert stored.kappa == pytest.approx(got.kappa, abs=0.01)
  assert stored.warmup_s == pytest.approx(got.warmup_s, abs=0.01)
  assert dict(stored.warmup_by) == pytest.approx(dict(got.warmup_by), abs=0.01)
  assert provenance["leave_one_out"]["runs"] == len(tpu_rows)
  # What the fitted runs cover (a prediction outside it extrapolates), and the spread of
  # the never-fitted v0.6 runs under these constants, with the sign of their bias.
  assert provenance["calibrated"] == fit.calibrated(tpu_rows)
  held, _ = fit.rows(tuple(c for c in cases.CASES if c.held_out), cases.default_results(),
                     cases.default_held_out())
  ratios = [timemodel.predict(r.inputs, got).total_s / r.measured.run_s for r in held]
  never = fit.biased_spread(ratios, fit.HELD_OUT)
  for key in ("factor_1sigma", "worst", "bias"):
    assert provenance["never_fitted"][key] == pytest.approx(never[key], abs=0.002), key
  assert (provenance["never_fitted"]["runs"], provenance["never_fitted"]["slower"]) == (
      never["runs"], never["slower"])
  u = uncertainty.of("tpu")
  assert u.never_fitted is not None and u.loo is not None
  assert u.wider.factor == max(u.loo.factor, u.never_fitted.factor)
  # The GPU efficiencies (per workload), fitted on the H100 runs each costed by what it ran.
  gpu, _ = fit.rows(cases.GPU_CASES, cases.default_results())
  assert not [r.case.name for r in gpu if r.not_fitted]  # BERT by the packed program
  stored_gpu, prov_gpu = estimate.constants("gpu")
  got_gpu = fit.fit_gpu(gpu, got)
  assert dict(stored_gpu.eta_by) == pytest.approx(dict(got_gpu.eta_by), rel=0.01)
  assert prov_gpu["calibrated"] == fit.calibrated(gpu)


def test_only_the_compiles_asked_for_are_made():
  have = {"bert@b2/m1/L2": {}}
  keys = [v.key for v in costs.VARIANTS if costs.wanted(v, {"ssd@b32/m1", "bert"}, have, True)]
  assert keys[:3] == ["ssd@b32/m1", "bert@b2/m1/L4", "bert@b16/m1/L2"]
  # and the length buckets' programs, at two depths each: 64 tokens masks 62 positions
  assert keys[3:5] == ["bert@b14/m1/L2/s64", "bert@b14/m1/L4/s64"] and len(keys) == 16
  short = next(v for v in costs.VARIANTS if v.seq == 64)
  assert "data.max_predictions_per_seq=62" in costs._args(short)
  # the full config packs (issue 47): the padded programs say so, the packed ones count rows
  assert "data.max_sequences_per_row=1" in costs._args(short)
  packed = next(v for v in costs.VARIANTS if v.packed and v.batch == 16)
  assert packed.key == "bert@b16/m1/L2/packed"
  assert "global_batch_size=128" in costs._args(packed)  # 16 rows of 2 on 4 devices
  assert len([v for v in costs.VARIANTS if costs.wanted(v, set(), have, False)]) == len(
      costs.VARIANTS)


def test_the_constants_written_are_the_ones_the_package_reads(tmp_path):
  """`fit.write` replaces a platform's time_model entry of an accelerators.yaml, keeping
  the rest of the file, in the form `estimate.constants` reads."""
  from mlbench import accelerators

  path = tmp_path / "accelerators.yaml"
  path.write_text(Path(accelerators.__file__).with_name("accelerators.yaml").read_text())
  stored, provenance = estimate.constants("tpu")
  changed = dataclasses.replace(stored, eta=0.25, warmup_by=(("bert", 1.5),))
  fit.write("tpu", changed, provenance["leave_one_out"], 24, path, note="a test")
  doc = yaml.safe_load(path.read_text())
  assert timemodel.Constants.from_dict(doc["time_model"]["tpu"]) == changed
  assert doc["time_model"]["tpu"]["command"] == "python -m benchmarks.calibration.fit --write"
  assert doc["time_model"]["gpu"] == accelerators.time_model("gpu")
  assert doc["tpu_v4"] == yaml.safe_load(Path(accelerators.__file__).with_name(
      "accelerators.yaml").read_text())["tpu_v4"]
