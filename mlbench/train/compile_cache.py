"""JAX's persistent compilation cache: a second run of a config loads its programs.

A full config's init, train and eval programs take 1.5-3 minutes each to
compile; JAX can keep the compiled executables on disk
(`jax_compilation_cache_dir`), keyed by the lowered program, the jax and
backend versions, the XLA flags (so `--xla_force_host_platform_device_count=8`
and 1 device never share an entry), the compile options and the devices'
topology. mlbench only points JAX at a folder and counts what it reports; the
cache itself is JAX's (`jax._src.compilation_cache`, an LRU file cache).

Entries are written by process 0 only (JAX's rule, against contended writes on
shared filesystems): on a pod whose hosts each use a local folder, only host 0's
compiles are cached, so point `--compile-cache` at a folder every host shares
(NFS, or a bucket: `gs://...`, read and written through etils.epath as JAX does)
to speed up the others too. On XLA:CPU (simulated multi-process runs) even that
does not help: each process's key holds its own view of the devices' topology,
so processes other than 0 never find an entry and compile every time.

A cache is a shortcut, never a reason to fail: a folder or bucket that cannot
be written (a forbidden bucket, a missing mount, a probe that hangs) turns the
cache off with a warning, and JAX itself only warns when an entry cannot be
read or written during the run (rate limits, HTTP 429).
"""

from __future__ import annotations

import dataclasses
import sys
import threading

from mlbench.storage import paths
from mlbench.errors import UserError

# JAX's own default, kept on purpose: what the cache is for are the programs that
# take seconds to minutes (init, train and eval steps). Everything else a mini
# ResNet-50 run compiles (a seed, a dtype cast, the MFU probe's matmul) took 15-37
# ms each, 0.1 s in all: caching those would add files and writes for nothing.
MIN_COMPILE_SECONDS = 1.0
PROBE_TIMEOUT_S = 60.0  # A bucket that does not answer a small write in a minute is no cache.

_HITS = "/jax/compilation_cache/cache_hits"
_WRITES = "/jax/compilation_cache/cache_misses"  # recorded when an entry is written
_SAVED = "/jax/compilation_cache/compile_time_saved_sec"
_LOAD = "/jax/compilation_cache/cache_retrieval_time_sec"


@dataclasses.dataclass
class Stats:
  """What the cache did in this process since `configure()`."""

  folder: paths.Path | None = None
  warning: str | None = None  # why the cache asked for is off
  hits: int = 0      # programs loaded instead of compiled
  writes: int = 0    # programs compiled and written
  saved_s: float = 0.0  # compile seconds the hits saved (JAX stores whole seconds)
  load_s: float = 0.0   # seconds spent reading and deserialising the hits

  def summary(self) -> str:
    """One line for the console."""
    if self.folder is None:
      return f"compile cache: off ({self.warning})" if self.warning else "compile cache: off"
    return (f"compile cache {self.folder}: {self.hits} program(s) loaded in "
            f"{self.load_s:,.1f} s (saving about {self.saved_s:,.0f} s of compiling), "
            f"{self.writes} compiled and written")

  def to_json(self) -> dict:
    """The counts for a command's JSON output."""
    return {"dir": None if self.folder is None else str(self.folder), "warning": self.warning,
            "hits": self.hits,
            "writes": self.writes, "saved_s": round(self.saved_s, 1),
            "load_s": round(self.load_s, 2)}


_stats = Stats()
_listening = False


def configure(path: paths.PathLike | None) -> None:
  """Points JAX's persistent cache at `path` (None: off). Call before the first compile.

  A `path` that cannot be created or written turns the cache off, with a warning
  on stderr (and in `stats().warning`), instead of failing the run.
  """
  import jax
  from jax.experimental.compilation_cache import compilation_cache

  global _stats
  warning = None
  if path is not None:
    path = paths.path(path, "--compile-cache")
    warning = _unusable(path)
    if warning is not None:
      print(f"warning: {warning}; compiling without a cache", file=sys.stderr)
      path = None
  new = None if path is None else str(path)
  if jax.config.jax_compilation_cache_dir != new:
    jax.config.update("jax_compilation_cache_dir", new)
    # JAX opens its cache once per process, at the first compile: a second setup in
    # the same process (tests, notebooks) must drop the one opened before.
    compilation_cache.reset_cache()
  jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
  _listen()
  _stats = Stats(folder=path, warning=warning)


def stats() -> Stats:
  """The counts since the last `configure()` (all zero when it was never called)."""
  return _stats


def _unusable(path: paths.Path) -> str | None:
  """Why `path` cannot hold the cache (None: it can), within PROBE_TIMEOUT_S."""
  from mlbench.storage import writes

  outcome: list[str | None] = []

  def probe() -> None:
    try:
      writes.check_writable(path, "--compile-cache", parents=True)
      outcome.append(None)
    except UserError as e:
      outcome.append(str(e))
    except Exception as e:  # A storage client's own error: the cache is off, the run goes on.
      outcome.append(f"--compile-cache {path}: {paths.why(e)}")

  thread = threading.Thread(target=probe, daemon=True, name="mlbench-cache-probe")
  thread.start()
  thread.join(PROBE_TIMEOUT_S)
  if not outcome:
    return f"--compile-cache {path} did not answer a test write in {PROBE_TIMEOUT_S:g} s"
  return outcome[0]


def _listen() -> None:
  """Counts JAX's cache events; registered once per process (listeners cannot be
  replaced one by one)."""
  global _listening
  if _listening:
    return
  from jax import monitoring

  def on_event(event: str, **_) -> None:
    if event == _HITS:
      _stats.hits += 1
    elif event == _WRITES:
      _stats.writes += 1

  def on_duration(event: str, seconds: float, **_) -> None:
    if event == _SAVED:
      _stats.saved_s += max(0.0, seconds)
    elif event == _LOAD:
      _stats.load_s += seconds

  monitoring.register_event_listener(on_event)
  monitoring.register_event_duration_secs_listener(on_duration)
  _listening = True
