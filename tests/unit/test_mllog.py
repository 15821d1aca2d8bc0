"""MLLog: values mllog would silently drop are converted; the caller's line is recorded."""

from __future__ import annotations

import enum
import inspect
import json

import jax.numpy as jnp
import numpy as np
import pytest

from mlbench.mllog import MLLog, plain


class Color(enum.Enum):
  RED = "red"


def test_plain_converts_jax_numpy_and_enum_values():
  assert plain(jnp.float32(0.5)) == 0.5 and type(plain(jnp.float32(0.5))) is float
  assert plain(np.int64(3)) == 3 and type(plain(np.int64(3))) is int
  assert plain(jnp.arange(3)) == [0, 1, 2]
  assert plain((1, np.float64(2.5))) == [1, 2.5]
  assert plain(Color.RED) == "red"
  assert plain(True) is True and plain(None) is None
  with pytest.raises(TypeError, match="cannot log a object"):
    plain(object())


def _lines(path):
  return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in path.read_text().splitlines()]


def test_jax_values_reach_the_file_with_the_callers_line(tmp_path):
  path = tmp_path / "log.txt"
  log = MLLog(path)
  log.seed(11); line = inspect.currentframe().f_lineno  # noqa: E702 - same line as the call
  log.hyperparameters({"lars_opt_momentum": jnp.float32(0.9), "model_bn_span": np.int32(128)})
  log.eval_result("eval_accuracy", jnp.float32(0.75), epoch=4, samples=5748, time_ms=123)
  log.run_stop(True)
  log.close()
  lines = _lines(path)
  assert [d["key"] for d in lines] == ["seed", "lars_opt_momentum", "model_bn_span",
                                       "eval_accuracy", "run_stop"]
  seed = lines[0]
  assert seed["value"] == 11 and seed["metadata"]["lineno"] == line
  assert seed["metadata"]["file"].endswith("test_mllog.py")
  assert lines[1]["value"] == pytest.approx(0.9) and lines[2]["value"] == 128
  assert lines[3]["time_ms"] == 123 and lines[3]["metadata"]["epoch_num"] == 4
  assert lines[4]["metadata"]["status"] == "success"


def test_an_existing_file_is_never_overwritten(tmp_path):
  path = tmp_path / "log.txt"
  path.write_text("keep")
  with pytest.raises(FileExistsError):
    MLLog(path)
  assert path.read_text() == "keep"


def _a_whole_run(log):
  """Every logging call a run makes, in a run's order."""
  log.cache_clear(False)
  log.init_start()
  log.submission(benchmark="resnet", org="mlbench", division="closed", status="research",
                 platform="cpu-test")
  log.seed(1)
  log.hyperparameters({"global_batch_size": 64, "opt_name": "lars"})
  log.event("mlbench_ruleset", "mini")
  log.init_stop()
  log.run_start()
  log.block_start(1, 4, 0)
  log.eval_start(4, 256)
  log.eval_result("eval_accuracy", 0.5, 4, 256)
  log.eval_stop(4, 256)
  log.block_stop(1, 256)
  log.run_stop(True)
  log.close()


def test_the_whole_run_sequence_writes_a_log(tmp_path, monkeypatch):
  # The positive control of the test below: the same calls, enabled, write lines.
  monkeypatch.chdir(tmp_path)
  _a_whole_run(MLLog(tmp_path / "log.txt"))
  assert [line["key"] for line in _lines(tmp_path / "log.txt")][:3] == [
      "cache_clear", "init_start", "submission_benchmark"]


def test_a_disabled_log_writes_nothing(tmp_path, monkeypatch, capfd):
  # mllog's own default logger prints to stdout, and a log file named without a
  # folder lands in the working directory: a disabled log reaches neither, nor stderr.
  monkeypatch.chdir(tmp_path)
  log = MLLog(None)
  _a_whole_run(log)
  assert log.path is None
  assert list(tmp_path.iterdir()) == []
  assert capfd.readouterr() == ("", "")
