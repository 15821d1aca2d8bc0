"""The private parts of other packages mlbench leans on, in the versions pyproject allows.

Each reaches past a library's public API because that API cannot do the job:
- `failed_saves.release_waiters` ends the threads of a failed orbax save through orbax's
  `_SignalingThread` (`cancel`, `_receive_signals`, `_operation_id`) and `set_signals`;
- `faults.gcs_retry` asks google-api-core's `Retry._predicate` (DEFAULT_RETRY's own
  judgement) before saying that it retries;
- `attention.cudnn` asks jax's own cuDNN checks before tracing;
- `agreement` and `peers` use jax.distributed's client (its key-value store, barriers) and
  its process index and count (`peers.leave` runs where jax may be shut down already).
A release that moves any of them fails here, by name, not in a run; pyproject's ranges are
the versions these tests (and the storage tests) were run with.
"""

from __future__ import annotations

import inspect
import threading
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = Path(__file__).parents[2] / "pyproject.toml"


def _declared(dist: str) -> list[Requirement]:
  project = tomllib.loads(PYPROJECT.read_text())["project"]
  reqs = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values()
                                      for r in extra)]
  return [r for r in map(Requirement, reqs) if r.name == dist]


@pytest.mark.parametrize("dist", ["orbax-checkpoint", "google-api-core"])
def test_the_installed_versions_are_within_the_declared_ranges(dist):
  declared = _declared(dist)
  assert declared and all(r.specifier for r in declared), f"pyproject declares no {dist} range"
  installed = Version(metadata.version(dist))
  assert all(installed in r.specifier for r in declared), (dist, installed, declared)


def test_orbax_futures_as_release_waiters_uses_them():
  from orbax.checkpoint._src.futures import future

  t = future._SignalingThread(target=lambda: None, send_signals=[], receive_signals=[],
                              timeout_secs=1, operation_id="x")
  assert isinstance(t, threading.Thread) and callable(t.cancel)
  assert t._receive_signals == [] and t._operation_id == "x"
  assert list(inspect.signature(future.set_signals).parameters) == ["send_signals",
                                                                     "operation_id"]


def test_google_api_core_retry_predicate_as_gcs_retry_uses_it():
  pytest.importorskip("google.cloud.storage")
  from google.api_core import exceptions
  from google.cloud.storage import retry

  assert retry.DEFAULT_RETRY._predicate(exceptions.ServiceUnavailable("busy"))
  assert not retry.DEFAULT_RETRY._predicate(exceptions.Forbidden("no"))


def test_jax_cudnn_checks_as_the_attention_choice_calls_them():
  from jax._src.cudnn import fused_attention_stablehlo as fa

  assert list(inspect.signature(fa.check_layout).parameters) == [
      "query", "key", "value", "bias", "q_seqlen", "kv_seqlen", "q_offsets", "kv_offsets",
      "page_table_k", "page_table_v", "layout"]
  assert list(inspect.signature(fa.check_is_flash_attention).parameters)[:7] == [
      "query", "key", "value", "layout", "cudnn_version", "has_bias", "is_training"]
  assert fa.AttentionLayout.BTNH.value is not None and callable(fa.check_cudnn_version)


def test_jax_distributed_client_as_agreement_uses_it():
  from jax._src import distributed
  from jax._src.lib import _jax

  for name in ("client", "process_id", "num_processes"):
    assert hasattr(distributed.global_state, name), name
  for name in ("key_value_set", "key_value_dir_get", "key_value_delete", "wait_at_barrier",
               "blocking_key_value_get", "key_value_try_get"):
    assert hasattr(_jax.DistributedRuntimeClient, name), name
