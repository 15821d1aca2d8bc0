"""The submission layout: result files are never clobbered; system descriptions pass the checker."""

from __future__ import annotations

import json
import os
import threading

import jax
import pytest
from mlperf_logging.system_desc_checker import system_desc_checker

from mlbench import system
from mlbench.storage import pending, results
from mlbench.errors import UserError


def _pending(root, text):
  run = pending.PendingRun(results.benchmark_dir(root, "sys", "resnet"),
                           results.new_run_id()).start()
  run.log_path.write_text(text)
  return run


def test_publish_takes_the_lowest_free_index_and_keeps_what_exists(tmp_path):
  folder = results.benchmark_dir(tmp_path, "sys", "resnet")
  folder.mkdir(parents=True)
  (folder / "result_0.txt").write_text("old run 0")
  (folder / "result_2.txt").write_text("old run 2")
  first = _pending(tmp_path, "new a").publish()
  second = _pending(tmp_path, "new b").publish()
  assert (first.name, second.name) == ("result_1.txt", "result_3.txt")
  assert (folder / "result_0.txt").read_text() == "old run 0"
  assert (folder / "result_2.txt").read_text() == "old run 2"
  assert first.read_text() == "new a" and second.read_text() == "new b"
  assert [p.name for p in results.result_files(folder)] == [f"result_{i}.txt" for i in range(4)]
  assert not list(folder.glob("pending_*"))


def test_concurrent_publishes_never_share_a_name(tmp_path):
  pendings = [_pending(tmp_path, f"run {i}") for i in range(16)]
  out = []
  threads = [threading.Thread(target=lambda p=p: out.append(p.publish())) for p in pendings]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert sorted(p.name for p in out) == sorted(f"result_{i}.txt" for i in range(16))
  assert sorted(p.read_text() for p in out) == sorted(f"run {i}" for i in range(16))


def test_a_pending_name_left_by_a_kill_inside_publish_is_known_as_the_result(tmp_path):
  run = _pending(tmp_path, "finished run")
  other = _pending(tmp_path, "killed run")
  result = run.publish()
  os.link(result, run.log_path)  # As a SIGKILL between the link and the unlink leaves it.
  assert pending.published_as(run.log_path) == result
  assert pending.published_as(other.log_path) is None


@pytest.fixture
def description():
  machine = system.probe(jax.local_devices(), 1)
  return system.describe(machine, system="cpu-test", submitter="mlbench", division="closed",
                          notes="test")


@pytest.mark.parametrize("ruleset", ["0.7.0", "4.0.0", "6.1.0"])
def test_system_description_passes_the_official_checker(tmp_path, description, ruleset):
  path = results.system_file(tmp_path, "cpu-test")
  system.ensure_system(tmp_path, description)
  valid, name, _, _ = system_desc_checker.check_system_desc(str(path), "training", ruleset)
  assert valid and name == "cpu-test"


def test_machine_facts_are_read_from_the_host(description):
  assert description["host_processor_vcpu_count"] == str(__import__("os").cpu_count())
  assert description["accelerators_per_node"] == "0"
  assert description["host_memory_capacity"].endswith(" GB")
  assert description["framework"].startswith("JAX ")
  assert system.default_system_name(system.probe(jax.local_devices(), 1)).startswith("cpu-")


def test_an_existing_description_is_kept_and_a_division_change_refused(tmp_path, description):
  path = results.system_file(tmp_path, "cpu-test")
  path.parent.mkdir(parents=True)
  edited = {**description, "host_networking": "edited by hand"}
  path.write_text(json.dumps(edited))
  assert system.ensure_system(tmp_path, description)["host_networking"] == "edited by hand"
  assert json.loads(path.read_text()) == edited
  with pytest.raises(UserError, match="is for the closed division but this run is open"):
    system.ensure_system(tmp_path, {**description, "division": "open"})
  path.write_text("{not json")
  with pytest.raises(UserError, match="is not valid JSON"):
    system.ensure_system(tmp_path, description)
  assert path.read_text() == "{not json"
