"""`mlbench check`: compile-only dry runs report memory, FLOPs and collectives."""

from __future__ import annotations

import json

import pytest


def _program(report: dict, name: str) -> dict:
  """The compiled program called `name` ("init", "train step", "eval step")."""
  return next(p for p in report["programs"] if p["name"] == name)


@pytest.mark.slow
def test_full_resnet50_on_a_data_parallel_pod_slice(mlbench, tmp_path):
  out = mlbench("check", "resnet50", "--config", "full", "--mesh", "data=8", "--cpu-devices",
                "8", "--json", cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-2000:]
  report = json.loads(out.stdout)
  assert report["params"] == 25_557_032 and report["mesh"] == {"data": 8}
  train, evaluation = _program(report, "train step"), _program(report, "eval step")
  # XLA's count of one step of 4096 images, about 24 GFLOP each (forward and backward).
  assert 23e9 * 4096 < train["flops"] < 25e9 * 4096
  assert train["collectives"]["all-reduce"] > 0  # The gradient sums.
  assert evaluation["collectives"]["all-reduce"] == 0  # Per-example outputs, no reduction.
  assert train["temp_bytes"] > 10 * 2**30  # 512 images per device, bfloat16 activations.
  assert report["param_bytes_per_device"] == report["params"] * 4
  assert not list(tmp_path.iterdir())  # Nothing was written or run.


@pytest.mark.slow  # Three checks, each compiling the mini's programs (about a minute).
def test_weight_update_sharding_and_model_parallelism_show_in_the_report(mlbench, tmp_path):
  plain = json.loads(mlbench("check", "resnet50", "--cpu-devices", "8", "--json").stdout)
  wus = json.loads(mlbench("check", "resnet50", "--cpu-devices", "8", "--json",
                           "--weight-update-sharding").stdout)
  tp = json.loads(mlbench("check", "resnet50", "--cpu-devices", "8", "--json",
                          "--mesh", "data=4,model=2").stdout)
  assert plain["opt_state_bytes_per_device"] == plain["opt_state_bytes_total"]
  assert wus["opt_state_bytes_per_device"] <= plain["opt_state_bytes_per_device"] / 8 * 1.03
  assert _program(wus, "train step")["collectives"]["all-gather"] > 0  # New weights gathered.
  assert tp["param_bytes_per_device"] < 0.55 * plain["param_bytes_per_device"]
  assert tp["mesh"] == {"data": 4, "model": 2}


@pytest.mark.slow
def test_transformer_model_parallelism_splits_weights_and_adds_collectives(mlbench):
  data_only = json.loads(mlbench("check", "transformer", "--cpu-devices", "8", "--json",
                                 "--mesh", "data=8").stdout)
  tp = json.loads(mlbench("check", "transformer", "--cpu-devices", "8", "--json",
                          "--mesh", "data=4,model=2").stdout)
  # Attention, MLP and the shared embedding are split in two; LayerNorms are not.
  ratio = tp["param_bytes_per_device"] / data_only["param_bytes_per_device"]
  assert 0.5 <= ratio < 0.52
  # Megatron-style: partial sums of the split matmuls are all-reduced over `model`
  # in the forward and backward passes, on top of the gradient sums.
  plain = _program(data_only, "train step")["collectives"]
  split = _program(tp, "train step")["collectives"]
  assert split["all-reduce"] > plain["all-reduce"]
