"""The command line: fast help, one-line errors with exit code 2, list and describe."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mlbench.cli import main

HEAVY = ("jax", "jaxlib", "tensorflow", "flax", "optax", "mlperf_logging")


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["list"], ["validate", "--help"],
                                  ["compare", "--help"]])
def test_help_and_list_import_no_heavy_framework(args):
  code = ("import sys; from mlbench.cli import main; rc = main(%r); "
          "print('LOADED', sorted({m.split('.')[0] for m in sys.modules} & set(%r))); "
          "sys.exit(rc)" % (args, HEAVY))
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
  assert out.returncode == 0, out.stderr
  assert "LOADED []" in out.stdout


def test_a_bad_request_is_one_line_on_stderr_with_exit_code_2(mlbench):
  out = mlbench("run", "resnet51", timeout=120)
  assert out.returncode == 2
  assert out.stderr == ("error: unknown workload 'resnet51'; choose one of: bert, efficientnet, "
                        "gpt_oss_20b, llama31_8b, moe, resnet50, ssd, transformer, vit\n")
  assert out.stdout == ""


@pytest.mark.parametrize("args, message", [
    (["run", "resnet50", "--config", "huge"],
     "error: unknown config 'huge' for resnet50; choose one of: full, mini, or give a path to a "
     ".py file"),
    (["run", "resnet50", "--set", "nope=1"], "error: unknown config key 'nope'; valid keys here:"),
    (["run", "resnet50", "--set", "global_batch_size=abc"],
     "error: global_batch_size must be an int; got 'abc'"),
    (["run", "resnet50", "--ruleset", "9.9.9"],
     "error: no 9.9.9 rules for benchmark 'resnet'; choose --ruleset from: 0.7.0, 4.0.0, mini"),
    (["run", "resnet50", "--set", "optimizer.weight_decay=0.0003"],
     "error: resnet50 (mini) breaks the mini resnet rules: lars_opt_weight_decay=0.0003 must "
     "satisfy power_of_two_times 0.0001; use --division open or change the config"),
    (["run", "resnet50", "--set", "global_batch_size=100"],
     "error: global_batch_size=100 does not split evenly over 8 data-parallel devices and 1 "
     "processes; --set global_batch_size= a multiple of 8"),
    (["run", "resnet50", "--division", "half"], "error: Invalid value for '--division'"),
    (["run", "resnet50", "--runs", "0"], "error: Invalid value for '--runs'"),
    (["run", "resnet50", "--bogus"], "error: no such option --bogus"),
    (["describe", "resnet5"],
     "error: unknown workload 'resnet5'; choose one of: bert, efficientnet, gpt_oss_20b, "
     "llama31_8b, moe, resnet50, ssd, transformer, vit"),
    (["run", "ssd", "--ruleset", "4.0.0"],
     "error: ssd does not implement the 4.0.0 ssd benchmark; choose --ruleset from: 0.7.0, mini"),
    (["run", "transformer", "--config", "full", "--data-dir", "/nonexistent/wmt"],
     "error: no *train*-of-* TFRecord files in /nonexistent/wmt; point --data-dir at the MLPerf WMT "
     "en-de TFRecords (*train*), their vocabulary and newstest2014.en/.de"),
    (["run"], "error: Missing argument 'WORKLOAD'. (see `mlbench run --help`)"),
    (["run", "resnet50", "--mesh", "data=3"], "error: mesh {'data': 3} needs 3 devices, there "
                                              "are 8"),
    (["run", "resnet50", "--mesh", "tensor=8"],
     "error: --mesh expects AXIS=SIZE,... with axes data, model, expert, spatial, stage; got "
     "'tensor=8'"),
    (["run", "resnet50", "--mesh", "data=4,stage=2"],
     "error: --mesh stage=2: resnet50 --config mini has no layer stack to split into pipeline "
     "stages; pipelines are for transformer workloads, drop the stage axis"),
    (["run", "resnet50", "--bn-group-size", "3"],
     "error: --bn-group-size 3 must divide the 8 data-parallel devices"),
    (["run", "resnet50", "--num-processes", "2"], "error: a multi-host run needs --coordinator "
                                                  "HOST:PORT, --num-processes N and --process-id I"),
    # A config's own checks, before anything is traced (mlbench.fields).
    (["run", "llama31_8b", "--set", "model.attention_chunk=100"],
     "error: model.attention_chunk: 100 does not divide data.seq_length (256); set 0 (one "
     "attention call) or a divisor of 256\n"),
    (["run", "bert", "--set", "model.num_heads=5"],
     "error: model.num_heads: 5 does not divide model.hidden_size (128); set a divisor of 128\n"),
    (["run", "ssd", "--set", "model.stage_strides=2,2,2"],
     "error: anchors.feature_sizes: (8, 4, 2) are not the model's feature maps for "
     "data.image_size 32 ((4, 2, 1)); set 4,2,1\n"),
    (["run", "moe", "--set", "model.moe.top_k=3"],
     "error: model.moe.top_k: 3 is not 1 or 2 (at most model.moe.num_experts, 4)\n"),
    (["run", "resnet50", "--config", "full", "--data-dir", "/nonexistent/imagenet"],
     "error: no train-*-of-* TFRecord files in /nonexistent/imagenet; point --data-dir at the "
     "ImageNet TFRecords written by imagenet_to_gcs.py"),
])
def test_bad_input_messages(capsys, tmp_path, args, message):
  rc = main(args + (["--results-dir", str(tmp_path)] if args[:1] == ["run"] and len(args) > 1
                    else []))
  err = capsys.readouterr().err
  assert rc == 2
  assert err.startswith(message), err
  assert err.count("\n") == 1 and "Traceback" not in err
  assert list(tmp_path.iterdir()) == []  # Nothing is written for a refused run.


def test_list_shows_benchmark_metric_target_and_default(capsys):
  assert main(["list"]) == 0
  out = capsys.readouterr().out
  for text in ("resnet50", "resnet", "eval_accuracy", ">= 0.98 (mini)", "mini", "4.0.0"):
    assert text in out


def _resnet_v15_parameters(stage_sizes, width, classes, stem_kernel):
  """Trainable parameters of a ResNet v1.5: bottleneck blocks of 1x1, 3x3 and 1x1 x4
  convolutions without biases, each followed by batch norm (scale and bias), a
  projection shortcut where the shape changes, and a dense classifier."""
  total = stem_kernel * stem_kernel * 3 * width + 2 * width
  c_in = width
  for stage, blocks in enumerate(stage_sizes):
    w = width * 2 ** stage
    for block in range(blocks):
      total += c_in * w + 9 * w * w + w * 4 * w + 2 * (w + w + 4 * w)
      if c_in != 4 * w or (stage > 0 and block == 0):
        total += c_in * 4 * w + 2 * 4 * w
      c_in = 4 * w
  return total + c_in * classes + classes


def test_describe_shows_sizes_hyperparameters_and_rules(capsys):
  # The formula gives torchvision's ResNet-50 (ResNet50_Weights.IMAGENET1K_V1,
  # "num_params": 25557032); the mini model is 4 stages of one block, width 16, a
  # 3x3 stem and 10 classes.
  assert _resnet_v15_parameters((3, 4, 6, 3), 64, 1000, 7) == 25_557_032
  from workloads.resnet50 import config

  mini = config.mini().model
  assert (mini.stage_sizes, mini.width, mini.num_classes) == ((1, 1, 1, 1), 16, 10)
  parameters = _resnet_v15_parameters(mini.stage_sizes, mini.width, mini.num_classes, 3)
  assert main(["describe", "resnet50", "--config", "mini"]) == 0
  out = capsys.readouterr().out
  assert f"parameters: {parameters:,}" in out and "training FLOPs per example" in out
  assert "optimizer.base_learning_rate" in out and "lars_opt_weight_decay" in out
  assert "rules mini" in out and "evaluate every 4 epochs" in out


def test_describe_json_carries_the_model_flops_every_mfu_uses(capsys):
  from mlbench import registry

  assert main(["describe", "ssd", "--json"]) == 0
  rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  w = registry.get("ssd")
  assert [r["config"] for r in rows] == list(w.configs)
  for r in rows:
    cfg = w.configs[r["config"]]()
    assert r["flops_per_example"] == w.flops_per_example(cfg) > 0
    assert r["parameters"] > 0 and r["quality"]["key"] == "eval_accuracy"
    assert r["hyperparameters"]["global_batch_size"] == cfg.global_batch_size
    assert r["hyperparameters"]["model.dtype"] in ("float32", "bfloat16")


def test_describe_shows_berts_batch_dependent_cadence_and_packing(capsys):
  # 4.0.0: every FLOOR(0.05 * (230.23 * 8192 + 3,000,000), 25,000) = 225,000 samples.
  assert main(["describe", "bert", "--config", "full"]) == 0
  out = capsys.readouterr().out
  assert "evaluate every 225000 samples" in out
  # Packed: the 8,192 sequences of a step in ceil(8192 / 1.95) rows.
  assert "packing: on, 8,192 examples a step in 4,202 rows (packing factor 1.950" in out
  assert main(["describe", "bert", "--config", "mini", "--json"]) == 0
  assert json.loads(capsys.readouterr().out)["packing"] is None


def test_a_run_is_a_success_only_when_nothing_judges_it_non_compliant(tmp_path, write_log):
  """A run that reached its target and whose log the official checker fails (or whose
  init ran past the rules' limit) is reported "not compliant", never "success"."""
  from mlbench import compliance, rules
  from mlbench.cli.run import run_status
  from mlbench.config import Division
  from mlbench.train.result import RunResult
  from mlbench.train.runner import Outcome

  rule = rules.load("resnet", "mini")
  passed = compliance.check_log(write_log(tmp_path / "a.txt", [0.99]), rule, tmp_path)
  failed = compliance.check_log(write_log(tmp_path / "b.txt", [0.99], drop=("lars_epsilon",)),
                                rule, tmp_path)
  assert passed.passed and not failed.passed

  def status(check, success=True, init_s=1.0):
    outcome = Outcome(0, RunResult(seed=1, success=success, init_s=init_s), check)
    return run_status(rule, Division.CLOSED, outcome)

  assert (status(passed), status(None), status(failed)) == ("success", "success", "not compliant")
  assert status(passed, init_s=31 * 60) == "not compliant"  # past the 30 closed minutes
  assert status(passed, success=False) == status(failed, success=False) == "aborted"
