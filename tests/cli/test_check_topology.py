"""`mlbench check --topology`: the TPU compiler (libtpu) compiles for a real slice, no TPU.

Reduced variants of the full configs (fewer layers, a small batch) keep each compile
to a minute or two on a 2-core machine; the full-size compiles are the benchmark's
(benchmarks/pod_prediction.py). Skipped where libtpu is not installed
(`pip install -e ".[test,tpu]"`).
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

pytest.importorskip("libtpu")

NOISE = ("TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES", "libtpu", "Traceback")


def resnet_v15_train_flops(stage_sizes, image=224, width=64, classes=1000) -> float:
  """Analytic training FLOPs of one image: 2 per multiply-add of every convolution and the
  classifier, forward x 3 (the backward pass computes two products per forward one),
  less the stem's input gradient, which nothing needs."""
  macs, res, chans = 0, image // 2, 3
  stem = res * res * 7 * 7 * chans * width
  macs += stem
  res, chans = res // 2, width  # 3x3/2 max pool.
  for stage, blocks in enumerate(stage_sizes):
    w = width * 2**stage
    for b in range(blocks):
      stride = 2 if (stage > 0 and b == 0) else 1
      out_res = res // stride
      macs += res * res * chans * w               # 1x1 reduce, at the input resolution
      macs += out_res * out_res * 9 * w * w       # 3x3, strided (v1.5)
      macs += out_res * out_res * w * 4 * w       # 1x1 expand
      if b == 0:
        macs += out_res * out_res * chans * 4 * w  # projection shortcut
      res, chans = out_res, 4 * w
  macs += chans * classes
  return 3 * 2 * macs - 2 * stem


def _check(mlbench, tmp_path, *args):
  out = mlbench("check", *args, "--json", cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  assert not [n for n in NOISE if n in out.stderr], out.stderr[-3000:]
  return json.loads(out.stdout)


def _assert_memory_and_prediction(report):
  hbm = report["hbm_bytes_per_device"]
  for p in report["programs"]:
    assert 0 < p["peak_bytes"] < hbm, p
  train = report["programs"][0]
  assert train["argument_bytes"] > 0 and train["output_bytes"] > 0 and train["temp_bytes"] > 0
  assert report["fits"] is True
  pred = report["prediction"]
  assert 0 < pred["mfu"] < 1 and pred["samples_per_s"] > 0 and pred["time_to_train_s"] > 0
  # The time to train is its printed terms, and no step beats the chip's peak FLOP/s.
  terms = pred["terms"]
  assert pred["time_to_train_s"] == pytest.approx(
      terms["warmup_s"] + terms["steps"] * terms["step_s"] + terms["evals"] * terms["eval_each_s"])
  assert pred["step_s"] == terms["step_s"] >= pred["roofline"]["compute_s"] > 0


@pytest.mark.slow
def test_a_reduced_resnet50_compiles_for_a_v4_slice_in_bfloat16(mlbench, tmp_path):
  stages = (1, 1, 1, 1)
  report = _check(mlbench, tmp_path, "resnet50", "--config", "full", "--topology", "v4-8",
                  "--set", "model.stage_sizes=1,1,1,1", "--set", "global_batch_size=32",
                  "--set", "eval_batch_size=32")
  assert report["device_kind"] == "TPU v4" and report["mesh"] == {"data": 4}
  assert report["accelerator"] == "tpu_v4"
  train, evaluation, init = report["programs"]
  assert init["name"] == "init" and init["output_bytes"] > 0
  assert train["flops"] == pytest.approx(32 * resnet_v15_train_flops(stages), rel=0.05)
  # Data parallelism: gradients are summed over the 4 chips; evaluation sums nothing.
  assert train["collectives"]["all-reduce"] > 0 and train["collective_bytes"]["all-reduce"] > 0
  assert sum(evaluation["collectives"].values()) == 0
  # Full configs compute in bfloat16 on TPUs; parameters and optimizer state stay float32.
  dtypes = train["matmul_input_dtypes"]
  assert dtypes.get("bf16", 0) > 0.9 * sum(dtypes.values()), dtypes
  assert set(report["param_dtypes"]) == {"float32"}
  assert set(report["opt_state_dtypes"]) <= {"float32", "int32"}
  # libtpu books -1 s for each ConcatBitcast (the joins of sliced prefetches; measured: 18
  # in this train step, 2 in its eval step); check adds them back (mlbench/pod/xlacost.py).
  assert (train["xla_concat_bitcasts"], evaluation["xla_concat_bitcasts"]) == (18, 2)
  for p in (train, evaluation):
    assert p["xla_raw_seconds"] < 0 < p["xla_seconds"] < 0.1
    assert p["xla_seconds"] == p["xla_raw_seconds"] + p["xla_concat_bitcasts"]
  assert report["prediction"]["xla_step_s"] == train["xla_seconds"]
  _assert_memory_and_prediction(report)


@pytest.mark.slow
def test_a_reduced_bert_large_compiles_for_a_v4_slice(mlbench, tmp_path):
  from workloads.bert import WORKLOAD

  # BERT-large's layers (1024 wide, 16 heads, 4096 MLP, 30,522-token vocabulary), two of
  # them, on 128-token sequences: a two-minute compile instead of an hour's.
  report = _check(mlbench, tmp_path, "bert", "--config", "full", "--topology", "v4-8",
                  "--set", "model.num_layers=2", "--set", "data.max_seq_length=128",
                  "--set", "data.max_predictions_per_seq=20", "--set", "global_batch_size=16",
                  "--set", "eval_batch_size=16")
  cfg = WORKLOAD.configs["full"]()
  cfg = dataclasses.replace(
      cfg, model=dataclasses.replace(cfg.model, num_layers=2),
      data=dataclasses.replace(cfg.data, max_seq_length=128, max_predictions_per_seq=20))
  # Packed (the full config's default): the 16 sequences in 16 / 1.95 rows, rounded up to
  # split over the 4 chips; the program runs the rows, the model FLOPs count the sequences.
  assert report["rows_per_step"] == 12 and report["global_batch_size"] == 16
  per_example = WORKLOAD.flops_per_example(cfg)
  assert report["flops_per_example"] == pytest.approx(per_example)
  train = report["programs"][0]
  # Measured: the compiled program counts 5.1 % more than the analytic matmul FLOPs (4.7 %
  # padded; packed rows add the segment masks' comparisons).
  assert train["flops"] == pytest.approx(12 * 1.95 * per_example, rel=0.06)
  assert train["collectives"]["all-reduce"] > 0
  # The reference's attention dropout trains on the dropout kernel, which declares its cost:
  # XLA's step estimate counts it (eval's splash kernels declare none: no estimate there).
  assert any(line.startswith("train step: ") and "dropout 0.1: pallas - " in line
             for line in report["attention"]), report["attention"]
  assert train["xla_seconds"] is not None and report["programs"][1]["xla_seconds"] is None
  assert report["prediction"]["model_flops_per_step"] == pytest.approx(16 * per_example)
  dtypes = train["matmul_input_dtypes"]
  assert dtypes.get("bf16", 0) > 0.8 * sum(dtypes.values()), dtypes
  assert set(report["param_dtypes"]) == {"float32"}
  _assert_memory_and_prediction(report)
  # Where the train step's bytes go (mlbench/pod/hbm.py): the parts add up to XLA's count,
  # which the ops' own bytes miss by little (measured: 6.8% over it here, where the
  # optimizer's update and its prefetches are 80% of the bytes; 1.0% on 2 layers at batch
  # 256 and 512 tokens); the attention's scores, the matmuls, the heads and the optimizer
  # each move bytes, in both layers; a TPU program draws the dropout bits inside the
  # fusions that use them and writes none.
  b = train["hbm"]
  assert sum(b["parts"].values()) == pytest.approx(train["bytes_accessed"]) == b["total"]
  assert abs(b["parts"]["unattributed"]) < 0.1 * b["total"], b["parts"]
  for kind in ("attention, scores and probabilities", "matmuls", "embeddings and heads",
               "optimizer update"):
    assert b["parts"][kind] > 0.005 * b["total"], b["parts"]
  assert b["parts"]["dropout random bits"] == 0 and b["layers"] == 2


@pytest.mark.slow  # A minute or two: XLA runs out of memory only after compiling.
def test_an_oversized_batch_does_not_fit_in_one_line(mlbench, tmp_path):
  out = mlbench("check", "resnet50", "--topology", "v5e-1", "--set", "global_batch_size=1048576",
                "--set", "eval_batch_size=128", cwd=tmp_path)
  assert out.returncode == 2
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: ") and "does not fit on v5e-1" in lines[0]
  assert "GiB of HBM" in lines[0] and "--set global_batch_size=" in lines[0]


def test_an_unknown_slice_is_a_one_line_error(mlbench, tmp_path):
  out = mlbench("check", "resnet50", "--topology", "v4-7", cwd=tmp_path)
  assert out.returncode == 2 and "unknown TPU slice 'v4-7'; use one of: " in out.stderr
  assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_a_cpu_run_stays_quiet_with_libtpu_installed(mlbench, tmp_path):
  report = _check(mlbench, tmp_path, "resnet50", "--cpu-devices", "2")
  assert report["platform"] == "cpu" and report["prediction"] is None


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("MLBENCH_LONG_COMPILES"),
                    reason="compiles the full Transformer-big for v5p-16 (5 CPU-minutes, past "
                           "the suite's budget); MLBENCH_LONG_COMPILES=1 runs it. The smaller "
                           "programs tried all print; test_pod_model covers the parts")
def test_a_program_xla_cannot_print_still_gets_mfu_and_a_prediction(mlbench, tmp_path):
  """libtpu writes async ops into the full Transformer's v5p programs that jaxlib cannot
  re-read to print ("async-update instruction should have 1 operands but sees 3"): the
  report still has MFU (analytic FLOPs) and a time to train, XLA's C++ stack dump stays
  off the terminal, and one line says what could not be read."""
  from workloads.transformer import WORKLOAD

  out = mlbench("check", "transformer", "--config", "full", "--topology", "v5p-16", "--json",
                cwd=tmp_path, timeout=3600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "Begin stack trace" not in out.stderr, out.stderr[-3000:]
  # XLA's message appears only inside mlbench's one line per program.
  assert all(line.startswith("XLA could not print the compiled ")
             for line in out.stderr.splitlines() if "RET_CHECK" in line), out.stderr[-3000:]
  report = json.loads(out.stdout)
  train = report["programs"][0]
  assert train["collective_source"] != "HLO text" and "async-update" in train["xla_error"]
  assert out.stderr.count("XLA could not print the compiled train step") == 1
  pred = report["prediction"]
  cfg = WORKLOAD.configs["full"]()
  assert pred["model_flops_per_step"] == pytest.approx(2048 * WORKLOAD.flops_per_example(cfg))
  assert 0 < pred["mfu"] < 1 and pred["time_to_train_s"] > 0
  assert pred["terms"]["collective_s"] >= 0 and pred["roofline"]["collective_s"] > 0
