"""A CPU machine with libtpu installed (the tpu extra): no command prints anything about
TPUs, whatever it imports. libtpu otherwise brings up a TPU client at JAX's first device
query and writes "Failed to find host bounds ... TPU_ACCELERATOR_TYPE" and an
INVALID_ARGUMENT line to stderr. The commands that train (`run`) and compile (`check`)
are covered by their own tests (test_resnet50_mini, test_check_topology); here each
command gets one cheap invocation, all at once."""

from __future__ import annotations

import pytest

pytest.importorskip("libtpu")

NOISE = ("TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES", "libtpu", "INVALID_ARGUMENT",
         "Traceback")


def test_no_command_prints_tpu_noise_on_a_cpu_machine(processes, tmp_path, write_log):
  (tmp_path / "results").mkdir()
  log = write_log(tmp_path / "results" / "result_0.txt", [0.99])
  commands = {  # argv: the exit codes that are right for it
      ("list",): {0},
      ("describe", "vit", "--config", "full"): {0},
      ("describe", "efficientnet", "--json"): {0},
      ("validate", str(log)): {0, 1},
      ("compare", str(tmp_path / "results")): {0, 1, 2},
      ("data", "verify", "imagenet", str(tmp_path / "none")): {2},
      ("check", "resnet50", "--set", "no.such=1"): {2},  # after JAX found its devices
      ("run", "resnet50", "--set", "no.such=1", "--results-dir", str(tmp_path)): {2},
  }
  # No JAX_PLATFORMS of the caller's; and libtpu loads even while another process holds
  # /tmp/libtpu_lockfile (it otherwise gives up without a word, which hides the noise).
  env = {"JAX_PLATFORMS": "", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
  started = {argv: processes.mlbench(*argv, cwd=tmp_path, env=env)[0] for argv in commands}
  for argv, process in started.items():
    done = process.wait(timeout=300)
    assert done.returncode in commands[argv], (argv, done.stderr[-2000:])
    assert not [n for n in NOISE if n in done.stderr], (argv, done.stderr[-2000:])
