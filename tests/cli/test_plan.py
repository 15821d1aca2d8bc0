"""`mlbench plan`: the command end to end (the search itself: tests/unit/test_pod_plan.py)."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from mlbench.cli import main

SCHEMA = json.loads(resources.files("mlbench").joinpath("pod", "plan.schema.json").read_text())


@pytest.mark.parametrize("args, says", [
    (["--slices", "v5p-7"], "unknown TPU slice 'v5p-7'; use one of:"),
    (["--slices", "v4-8", "--batches", "4096,lots"], "--batches 4096,lots: give auto or"),
    (["--slices", "v4-8", "--batches", "6"], "no batch splits over any of the slices"),
    (["--slices", "h100-12"], "GPUs come in nodes of 8"),
    (["--config", "mini", "--slices", "v4-8"], "no MLPerf round's); give a file of them with "
                                               "--rcps FILE"),
    (["--slices", "v4-8", "--costs", "calibration", "--set", "model.width=32"],
     "--costs calibration has the full configs' compiles only"),
])
def test_bad_requests_end_in_one_line(capsys, args, says):
  assert main(["plan", "resnet50", *args]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and says in err and len(err.strip().splitlines()) == 1, err


def test_a_plan_from_the_calibration_compiles_ranks_v4_slices(capsys, tmp_path):
  """No compile: the time model's cached compiles of the full ResNet-50; every candidate
  fits a v4 chip, the JSON follows its schema, the plot is written and never replaced."""
  import jsonschema

  plot = tmp_path / "plan.png"
  args = ["plan", "resnet50", "--costs", "calibration", "--slices", "v4-512,v4-2048,h100-64",
          "--batches", "8192,32768", "--json", "--plot", str(plot)]
  assert main(args) == 0
  out = capsys.readouterr()
  doc = json.loads(out.out)
  jsonschema.validate(doc, SCHEMA)
  rows = doc["candidates"]
  assert len(rows) == 6 and all(r["fits"] for r in rows)
  assert [r["rank"] for r in rows] == [1, 2, 3, 4, 5, 6]
  scores = [r["time_s"]["score"] for r in rows]
  assert scores == sorted(scores)
  gpu = [r for r in rows if r["platform"] == "gpu"]
  assert len(gpu) == 2 and all(r["program"]["counts_from_tpu"] for r in gpu)
  # More chips at the same batch: faster, and no cheaper.
  by = {(r["slice"], r["global_batch"]): r for r in rows}
  assert by[("v4-2048", 8192)]["time_s"]["median"] < by[("v4-512", 8192)]["time_s"]["median"]
  assert any(r["pareto"] for r in rows)
  assert "RCP" in out.err and "(GPU)" in out.err and plot.stat().st_size > 10_000
  assert plot.read_bytes()[:4] == b"\x89PNG"
  assert main(args) == 2  # the plot file exists now
  assert "exists" in capsys.readouterr().err


def test_the_table_is_the_output_the_notes_go_to_stderr(capsys):
  """`mlbench plan ... > plan.txt` keeps the table (it printed on stderr: an empty file)."""
  assert main(["plan", "resnet50", "--costs", "calibration", "--slices", "v4-512,v4-2048",
               "--batches", "8192"]) == 0
  out = capsys.readouterr()
  table = [line for line in out.out.splitlines() if "v4-" in line]
  assert len(table) == 2 and all("8,192" in line for line in table), out.out
  assert "rank by time" in out.out and "median" in out.out
  assert "v4-512" not in out.err and "steps to converge: " in out.err  # the notes


@pytest.mark.slow  # three compiles of the mini ResNet-50 for a TPU v4 slice (about a minute)
def test_one_compile_per_per_device_batch_then_none_from_the_cache(mlbench, tmp_path):
  pytest.importorskip("libtpu")
  import jsonschema

  rcps = tmp_path / "rcps.json"
  rcps.write_text(json.dumps({
      "a": {"Benchmark": "resnet", "BS": 64, "Epochs to converge": [8, 9, 9, 10, 10, 11, 12]},
      "b": {"Benchmark": "resnet", "BS": 256, "Epochs to converge": [10, 11, 12, 12, 13, 14]}}))
  args = ("plan", "resnet50", "--config", "mini", "--slices", "v4-8,v4-16", "--batches",
          "64,128", "--rcps", str(rcps), "--compile-cache", str(tmp_path / "cache"), "--json")
  cold = mlbench(*args, cwd=tmp_path)
  assert cold.returncode == 0, cold.stderr[-3000:]
  doc = json.loads(cold.stdout)
  jsonschema.validate(doc, SCHEMA)
  # Per device: 64/4 = 16, 64/8 = 8, 128/4 = 32, 128/8 = 16: three programs for v4-8.
  assert sorted((c["proxy"], c["per_device"], c["origin"]) for c in doc["compiles"]) == [
      ("v4-8", 8, "compiled"), ("v4-8", 16, "compiled"), ("v4-8", 32, "compiled")]
  assert len(doc["candidates"]) == 4 and all(c["fits"] for c in doc["candidates"])
  warm = mlbench(*args, cwd=tmp_path)
  again = json.loads(warm.stdout)
  assert {c["origin"] for c in again["compiles"]} == {"cache"} and len(again["compiles"]) == 3
  assert "programs: 0 compiled" in warm.stderr and "3 read back" in warm.stderr
  assert [c["time_s"] for c in again["candidates"]] == [c["time_s"] for c in doc["candidates"]]


@pytest.mark.slow  # two compiles of the mini ResNet-50 for TPU v4 slices (about 30 s)
def test_the_per_device_program_does_not_depend_on_the_data_axis(mlbench, tmp_path):
  """Why one compile serves every slice of a generation at a per-device batch: the same
  16 examples a chip on 4 and 64 v4 chips compile to the same per-device FLOPs, HBM
  bytes, peak memory and gradient all-reduce bytes (only the all-reduce's group grows,
  which the plan times on each slice's torus)."""
  pytest.importorskip("libtpu")
  seen = []
  for slice_, chips in (("v4-8", 4), ("v4-128", 64)):
    out = mlbench("check", "resnet50", "--topology", slice_, "--set",
                  f"global_batch_size={16 * chips}", "--set", f"eval_batch_size={16 * chips}",
                  "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    train, evaluation = report["programs"][0], report["programs"][1]
    seen.append((train["flops"] / chips, train["bytes_accessed"], train["peak_bytes"],
                 train["collective_bytes"], evaluation["flops"] / chips,
                 evaluation["bytes_accessed"], evaluation["peak_bytes"]))
  assert seen[0] == seen[1]
