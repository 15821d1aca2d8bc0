"""Shared test setup: a simulated 8-device pod, and isolated caches.

Every test runs on 8 simulated CPU devices (set before JAX starts), as the
harness would on a pod slice. Generated data, derived checker rules and the
compilation cache go to a per-session temporary folder, never to the user's ~/.cache.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

DEVICES = 8


def pytest_configure(config):
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import jax

  jax.config.update("jax_num_cpu_devices", DEVICES)


@pytest.fixture(scope="session", autouse=True)
def _cache_dir(tmp_path_factory):
  cache = tmp_path_factory.mktemp("mlbench-cache")
  old = os.environ.get("MLBENCH_CACHE_DIR")
  os.environ["MLBENCH_CACHE_DIR"] = str(cache)
  yield cache
  if old is None:
    os.environ.pop("MLBENCH_CACHE_DIR", None)
  else:
    os.environ["MLBENCH_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def data_dir(_cache_dir) -> Path:
  """The ResNet-50 mini dataset (digits TFRecords), generated once per session."""
  from workloads.resnet50 import WORKLOAD, config

  path = _cache_dir / "data"
  WORKLOAD.input.prepare(config.mini(), path)
  return path


@pytest.fixture(scope="session")
def bert_data_dir(_cache_dir) -> Path:
  """The BERT mini dataset (pydoc TFRecords), generated once per session."""
  from workloads.bert import WORKLOAD, config

  path = _cache_dir / "data"
  WORKLOAD.input.prepare(config.mini(), path)
  return path


def _run_mlbench(*args: str, cwd: Path | None = None, env: dict | None = None,
                 timeout: float = 900) -> subprocess.CompletedProcess:
  full_env = {**os.environ, **(env or {})}
  full_env.pop("XLA_FLAGS", None)
  return subprocess.run([sys.executable, "-c", "import sys; from mlbench.cli import main; "
                         "sys.exit(main())", *args], capture_output=True, text=True, cwd=cwd,
                        env=full_env, timeout=timeout)


@pytest.fixture
def mlbench():
  """Runs the real `mlbench` command line in a fresh process: mlbench(*args, cwd=, env=)."""
  return _run_mlbench


@pytest.fixture
def write_log():
  """write_log(path, accuracies, *, seed=7, drop=(), status_success=True): a complete
  closed-division ResNet mini log written through MLLog, as `mlbench run` writes one."""
  from mlbench.mllog import MLLog
  from mlbench.train.plan import harness_hparams
  from mlbench.workload import StepContext
  from workloads.resnet50 import WORKLOAD, config

  def write(path, accuracies, *, seed=7, drop=(), status_success=True, ruleset="mini"):
    cfg = config.mini()
    sched = WORKLOAD.schedule(cfg)
    hparams = {**harness_hparams(sched),
               **WORKLOAD.hparams(cfg, sched, StepContext(mesh=None, bn_groups=1))}
    log = MLLog(path)
    log.cache_clear(False)
    log.init_start()
    log.submission(benchmark="resnet", org="mlbench", division="closed", status="research",
                   platform="cpu-test")
    log.seed(seed)
    log.hyperparameters({k: v for k, v in hparams.items() if k not in drop})
    log.event("mlbench_ruleset", ruleset)
    log.init_stop()
    log.run_start()
    for i, acc in enumerate(accuracies):
      epoch = 4 * (i + 1)
      log.block_start(epoch - 3, 4, 0)
      log.eval_start(epoch, 0)
      log.eval_result("eval_accuracy", acc, epoch, 0)
      log.eval_stop(epoch, 0)
      log.block_stop(epoch - 3, 0)
    log.run_stop(status_success)
    log.close()
    return path

  return write
