"""Shared test setup: a simulated 8-device pod, and isolated caches.

Every test runs on 8 simulated CPU devices (set before JAX starts), as the
harness would on a pod slice. Generated data, derived checker rules and the
compilation cache go to a per-session temporary folder, never to the user's ~/.cache.
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

DEVICES = 8


def pytest_configure(config):
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import jax

  jax.config.update("jax_num_cpu_devices", DEVICES)


# Fixtures of these names compile every mini once per process: the files that use them share
# one xdist worker, not compile them twice.
_SHARED_COMPILES = {"compiled", "compile_workload"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
  """Under pytest-xdist, a test file runs on one worker (its module fixtures are built
  once), and the files that use the session's compiled minis on the same one. Files with
  a slow test go first (pyproject's --no-loadscope-reorder keeps this order): a worker
  that starts a two-minute file last would leave the other idle, while the many short
  files at the end even the two workers out (about a minute of the suite on 2 cores)."""
  shared = {item.path for item in items if _SHARED_COMPILES & set(item.fixturenames)}
  slow = {item.path for item in items if item.get_closest_marker("slow")}
  for item in items:
    group = "compiled-minis" if item.path in shared else str(item.path)
    item.add_marker(pytest.mark.xdist_group(group))
  items.sort(key=lambda item: item.path not in slow)  # stable: files stay in their order


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


def _mini_data(cache: Path, workload: str) -> Path:
  """The data folder with `workload`'s mini dataset in it, generated once per session (each
  workload writes its own subfolder)."""
  from mlbench import registry

  w = registry.get(workload)
  w.input.prepare(w.configs["mini"](), cache / "data")
  return cache / "data"


def _mini_data_fixture(name: str, workload: str, what: str):
  """A session fixture `name`: the data folder holding `workload`'s mini dataset (`what`)."""

  def fixture(_cache_dir) -> Path:
    return _mini_data(_cache_dir, workload)

  fixture.__doc__ = f"The {workload} mini dataset ({what}), generated once per session."
  return pytest.fixture(scope="session", name=name)(fixture)


data_dir = _mini_data_fixture("data_dir", "resnet50", "digits TFRecords")
bert_data_dir = _mini_data_fixture("bert_data_dir", "bert", "pydoc TFRecords")
ssd_data_dir = _mini_data_fixture("ssd_data_dir", "ssd", "digit scenes as COCO TFRecords")
transformer_data_dir = _mini_data_fixture("transformer_data_dir", "transformer",
                                          "CLDR pairs and their BPE vocabulary")
moe_data_dir = _mini_data_fixture("moe_data_dir", "moe", "pydoc sequences")
llama_data_dir = _mini_data_fixture("llama_data_dir", "llama31_8b", "Megatron .bin/.idx")
gpt_oss_data_dir = _mini_data_fixture("gpt_oss_data_dir", "gpt_oss_20b",
                                      "Megatron .bin/.idx, llama31_8b's corpus")


MLBENCH = (sys.executable, "-c", "import sys; from mlbench.cli import main; sys.exit(main())")
"""The real `mlbench` command line, in a fresh interpreter."""


def free_port(low: int = 0, high: int = 0) -> int:
  """A TCP port on 127.0.0.1 that nothing listens on: any the OS picks, or one in
  [low, high) (a launcher that derives the port from a job id needs its range)."""
  for port in [0] if not low else random.Random().sample(range(low, high), 200):
    with socket.socket() as s:
      try:
        s.bind(("127.0.0.1", port))
      except OSError:
        continue
      return s.getsockname()[1]
  raise RuntimeError(f"no free port in [{low}, {high})")


@dataclasses.dataclass
class Process:
  """A process a test started; stdout and stderr go to files, so no pipe ever fills up and
  blocks it, and what it wrote so far can be read at any time."""

  popen: subprocess.Popen
  out: Path
  err: Path

  @property
  def pid(self) -> int:
    return self.popen.pid

  @property
  def returncode(self) -> int | None:
    return self.popen.returncode

  @property
  def stdout(self) -> str:
    return self.out.read_text(errors="replace")

  @property
  def stderr(self) -> str:
    return self.err.read_text(errors="replace")

  def poll(self) -> int | None:
    return self.popen.poll()

  def send_signal(self, signum: int) -> None:
    self.popen.send_signal(signum)

  def kill(self) -> None:
    """SIGKILLs it and every process it started (a job's workers), and reaps it."""
    _kill(self.popen)

  def wait(self, timeout: float = 900) -> subprocess.CompletedProcess:
    """Waits for the exit; (args, returncode, stdout, stderr). A process still running
    after `timeout` s is killed and the test fails with the end of its stderr."""
    try:
      self.popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      _kill(self.popen)
      raise AssertionError(f"pid {self.pid} ran over {timeout} s: {self.stderr[-3000:]}")
    return subprocess.CompletedProcess(self.popen.args, self.returncode, self.stdout,
                                       self.stderr)


def _kill(popen: subprocess.Popen) -> None:
  """SIGKILLs a process and whatever it started (its own session), and reaps it."""
  try:
    os.killpg(popen.pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass
  popen.wait()


class Processes:
  """Starts the processes of one test and reaps every one of them when the test ends.

  `start(argv, n=N)` starts N processes on 127.0.0.1 (`argv`, or `argv(i)` for process i if
  it is a callable); with N > 1 they are the processes of one jax.distributed job: each
  gets `--coordinator 127.0.0.1:PORT --num-processes N --process-id I` (a free port), unless
  `distributed=False` (processes that find each other from their environment, as
  `env_for(i)` sets it: SLURM's). Every process runs in its own session without the test's
  XLA_FLAGS (it sets its own devices).
  """

  free_port = staticmethod(free_port)
  MLBENCH = MLBENCH

  def __init__(self, folder: Path):
    self.folder, self.started = folder, []

  def start(self, argv, *, n: int = 1, cwd: Path | None = None, env: dict | None = None,
            env_for=None, distributed: bool | None = None) -> list[Process]:
    base = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | (env or {})
    job = []
    if distributed if distributed is not None else n > 1:
      job = ["--coordinator", f"127.0.0.1:{free_port()}", "--num-processes", str(n)]
    out = []
    for i in range(n):
      k = len(self.started)
      paths = self.folder / f"{k}.out", self.folder / f"{k}.err"
      with paths[0].open("w") as stdout, paths[1].open("w") as stderr:
        popen = subprocess.Popen(
            [*map(str, argv(i) if callable(argv) else argv), *job,
             *(["--process-id", str(i)] if job else [])], cwd=cwd,
            env=base | (env_for(i) if env_for else {}), stdout=stdout, stderr=stderr,
            text=True, start_new_session=True)
      self.started.append(Process(popen, *paths))
      out.append(self.started[-1])
    return out

  def mlbench(self, *args, **kwargs) -> list[Process]:
    """start() of the `mlbench` command line with these arguments."""
    return self.start([*MLBENCH, *args], **kwargs)

  def run(self, argv, *, timeout: float = 900, **kwargs) -> list[subprocess.CompletedProcess]:
    """start(), then wait for every process; any still running at `timeout` s is killed."""
    return [p.wait(timeout) for p in self.start(argv, **kwargs)]

  def reap(self) -> None:
    for p in self.started:
      if p.poll() is None:
        _kill(p.popen)
      p.popen.wait()


@pytest.fixture
def processes(tmp_path_factory):
  """Processes of this test (see `Processes`), every one killed and reaped at its end."""
  group = Processes(tmp_path_factory.mktemp("processes"))
  yield group
  group.reap()


@pytest.fixture
def mlbench(tmp_path_factory):
  """Runs the real `mlbench` command line in a fresh process to its end:
  mlbench(*args, cwd=, env=, timeout=) -> CompletedProcess."""
  group = Processes(tmp_path_factory.mktemp("processes"))

  def run(*args: str, cwd: Path | None = None, env: dict | None = None,
          timeout: float = 900) -> subprocess.CompletedProcess:
    [done] = group.run([*MLBENCH, *args], cwd=cwd, env=env, timeout=timeout)
    return done

  yield run
  group.reap()


class SmallDisks:
  """Real file systems of a few MiB for a test: `disks(mib)` mounts a tmpfs of that size and
  returns its folder (skipping the test where it cannot mount: not root); `disks.fill(f)`
  fills the disk under `f` to its last byte and returns the file that does it."""

  def __init__(self, folder: Path):
    self.folder, self.mounted = folder, []

  def __call__(self, mib: float) -> Path:
    mnt = self.folder / f"disk{len(self.mounted)}"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={int(mib * 1024)}k", "tmpfs",
                       str(mnt)], capture_output=True).returncode:
      pytest.skip("cannot mount a small tmpfs here (needs root)")
    self.mounted.append(mnt)
    return mnt

  @staticmethod
  def fill(folder: Path) -> Path:
    filler = Path(folder) / "filler"
    with open(filler, "wb", buffering=0) as f:
      try:
        while True:
          f.write(b"\0" * (1 << 20))
      except OSError:  # No space left on device: full.
        pass
    return filler


@pytest.fixture
def small_disk(tmp_path):
  """small_disk(mib) -> the folder of a real file system that small (see SmallDisks);
  `small_disk.fill(folder)` fills it. Unmounted when the test ends."""
  disks = SmallDisks(tmp_path)
  yield disks
  for mnt in disks.mounted:
    subprocess.run(["umount", "-l", str(mnt)], check=True)


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
