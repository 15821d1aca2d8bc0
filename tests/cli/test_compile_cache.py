"""The persistent compilation cache: a second process loads what the first compiled."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import pytest

from mlbench.train import compile_cache

_CHECK = ("check", "resnet50", "--cpu-devices", "8", "--json")


def _entries(folder):
  return sorted(p.name for p in folder.glob("*-cache")) if folder.exists() else []


def _programs(report: dict) -> list:
  """What check says of each compiled program: the same for a compiled and a loaded one."""
  return [(p["name"], p["flops"], p["temp_bytes"], p["argument_bytes"], p["collectives"])
          for p in report["programs"]]


@pytest.mark.slow
def test_a_second_process_loads_the_programs_the_first_compiled(mlbench, tmp_path):
  cache = tmp_path / "jax"
  first = mlbench(*_CHECK, "--compile-cache", str(cache))
  assert first.returncode == 0, first.stderr[-2000:]
  written = json.loads(first.stdout)
  # The train step and init of the mini ResNet take seconds to compile, over JAX's
  # 1 s threshold: each is one entry, and nothing was there to load.
  assert written["compile_cache"]["dir"] == str(cache)
  assert written["compile_cache"]["hits"] == 0
  assert written["compile_cache"]["writes"] >= 2
  assert len(_entries(cache)) == written["compile_cache"]["writes"]

  second = mlbench(*_CHECK, "--compile-cache", str(cache))
  assert second.returncode == 0, second.stderr[-2000:]
  loaded = json.loads(second.stdout)
  # JAX's own event (/jax/compilation_cache/cache_hits), counted in the new process.
  assert loaded["compile_cache"]["hits"] == written["compile_cache"]["writes"]
  assert loaded["compile_cache"]["writes"] == 0
  assert "program(s) loaded" in second.stderr
  # A loaded executable reports the same memory, FLOPs and collectives.
  assert _programs(loaded) == _programs(written)
  # Without --json the report is the product, on stdout (`> report.txt` keeps it); the cache's
  # note stays on stderr.
  plain = mlbench(*_CHECK[:-1], "--compile-cache", str(cache))
  assert plain.returncode == 0, plain.stderr[-2000:]
  assert "compiled programs" in plain.stdout and "train step" in plain.stdout
  assert "program(s) loaded" in plain.stderr and "compiled programs" not in plain.stderr


def test_the_off_switch_makes_no_cache_folder(monkeypatch, tmp_path):
  from mlbench.cli import main

  monkeypatch.setenv("MLBENCH_CACHE_DIR", str(tmp_path))
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  # Refused by the plan's checks, after the process setup and before any compile.
  refused = ["run", "resnet50", "--set", "global_batch_size=100", "--results-dir",
             str(tmp_path / "results")]
  assert main([*refused, "--compile-cache", "off"]) == 2
  monkeypatch.setenv("MLBENCH_COMPILE_CACHE", "off")
  assert main(refused) == 2
  assert not (tmp_path / "jax").exists()
  assert compile_cache.stats().folder is None
  monkeypatch.delenv("MLBENCH_COMPILE_CACHE")
  assert main(refused) == 2
  assert (tmp_path / "jax").is_dir()  # On by default: made (and proved writable) at setup.
  assert compile_cache.stats().folder == tmp_path / "jax"


def test_the_folder_for_each_value(monkeypatch, tmp_path):
  from mlbench.config import compile_cache_dir

  monkeypatch.setenv("MLBENCH_CACHE_DIR", str(tmp_path))
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  assert compile_cache_dir(None) == compile_cache_dir("") == tmp_path / "jax"
  assert compile_cache_dir("off") is compile_cache_dir("OFF") is None
  assert compile_cache_dir("~/x") == Path.home() / "x"
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/srv/jax")  # JAX's own setting wins.
  assert compile_cache_dir(None) == Path("/srv/jax")
  assert compile_cache_dir(str(tmp_path)) == tmp_path


@pytest.mark.slow
def test_the_default_folder_and_a_key_that_holds_the_device_count(mlbench, tmp_path):
  env = {"MLBENCH_CACHE_DIR": str(tmp_path)}
  eight = mlbench(*_CHECK, env=env)
  assert eight.returncode == 0, eight.stderr[-2000:]
  assert json.loads(eight.stdout)["compile_cache"]["writes"] >= 2
  assert _entries(tmp_path / "jax")  # On by default, under $MLBENCH_CACHE_DIR.
  # The same program on 4 devices finds nothing of the 8-device one.
  four = mlbench("check", "resnet50", "--cpu-devices", "4", "--json", env=env)
  assert four.returncode == 0, four.stderr[-2000:]
  assert json.loads(four.stdout)["compile_cache"]["hits"] == 0


@pytest.fixture
def restore_jax_cache():
  """Puts JAX's cache settings of this test process back afterwards."""
  from jax.experimental.compilation_cache import compilation_cache as cc

  before = (jax.config.jax_compilation_cache_dir,
            jax.config.jax_persistent_cache_min_compile_time_secs)
  yield
  jax.config.update("jax_compilation_cache_dir", before[0])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])
  cc.reset_cache()


def test_configuring_again_in_one_process_moves_the_cache(tmp_path, monkeypatch,
                                                         restore_jax_cache):
  # A tiny program compiles in milliseconds: cache every program for this test only.
  monkeypatch.setattr(compile_cache, "MIN_COMPILE_SECONDS", 0.0)
  x = jax.numpy.arange(7.0)

  def compile_once(scale):
    jax.jit(lambda v: v * scale + 1).lower(x).compile()

  compile_cache.configure(tmp_path / "a")
  compile_once(3.0)
  assert len(_entries(tmp_path / "a")) == 1 and compile_cache.stats().writes == 1
  compile_cache.configure(tmp_path / "b")  # JAX opened "a": it must be dropped.
  compile_once(5.0)
  assert len(_entries(tmp_path / "a")) == 1 and len(_entries(tmp_path / "b")) == 1
  compile_cache.configure(tmp_path / "a")
  compile_once(3.0)
  assert compile_cache.stats().hits == 1 and compile_cache.stats().writes == 0
  compile_cache.configure(None)
  compile_once(7.0)
  assert len(_entries(tmp_path / "a")) == 1 and len(_entries(tmp_path / "b")) == 1
  assert compile_cache.stats().folder is None


def _two_process_check(processes, cache, cwd) -> list[dict]:
  """`mlbench check` as a 2-process run on this host (jax.distributed on 127.0.0.1)."""
  done = processes.run([*processes.MLBENCH, "check", "resnet50", "--cpu-devices", "4",
                        "--compile-cache", cache, "--json"], n=2, cwd=cwd, timeout=600)
  assert [p.returncode for p in done] == [0, 0], [p.stderr[-2000:] for p in done]
  return [json.loads(p.stdout)["compile_cache"] for p in done]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_only_process_0_writes_and_loads_in_a_two_process_run(processes, tmp_path):
  cache = tmp_path / "jax"
  leader, follower = _two_process_check(processes, cache, tmp_path)
  # JAX writes entries from process 0 only (against contended writes on shared storage).
  assert leader["writes"] >= 2 and follower["writes"] == 0
  assert len(_entries(cache)) == leader["writes"]
  leader2, follower2 = _two_process_check(processes, cache, tmp_path)
  # Only process 0 writes; it may write a program the first run compiled in under
  # MIN_COMPILE_SECONDS (not cached) and this one, on a busy machine, in more.
  assert leader2["hits"] == leader["writes"] and follower2["writes"] == 0
  # Process 1 finds nothing on XLA:CPU: its key holds its own view of the devices'
  # topology (seen: only the accelerator_config part of the key differs), so it
  # compiles again, and the run waits for it at the first collective.
