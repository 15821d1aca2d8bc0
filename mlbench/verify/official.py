"""The official mlperf-logging tools, run where they cannot hurt us.

Each call runs in a worker process (spawned, so nothing of the caller's JAX or
TensorFlow state is inherited) under a time limit, in parallel over a few
workers. A tool that raises, crashes or hangs gives an `Outcome` with `error`
set (the exception; the exit code or signal; the file and line it hung on)
instead of taking mlbench down. What is known to stall or crash the official
parser (lines too long for its quadratic regex, lines it raises on) is found
beforehand by `mlbench.verify.screen`, so such a log is never handed to a tool.
The tools log through the root logger; a worker collects those messages and
returns them. The RCP checker runs through mlbench.verify.rcp.

The functions named `_tool_*` run inside the workers.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib
import logging
import multiprocessing
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from multiprocessing import connection
from multiprocessing.connection import Connection
from typing import Any

from mlbench.errors import Interrupted


RULESETS_WITH_PACKAGE_CHECKS = ("1.0.0", "1.1.0", "2.0.0", "2.1.0", "3.0.0", "3.1.0", "4.0.0",
                                "4.1.0", "5.0.0", "5.1.0", "6.0.0", "6.1.0")


@dataclasses.dataclass(frozen=True)
class Outcome:
  """What a tool returned, or why it did not return."""

  value: Any = None
  messages: tuple[str, ...] = ()
  error: str | None = None


class _Collect(logging.Handler):
  def __init__(self):
    super().__init__(logging.INFO)
    self.records: list[str] = []

  def emit(self, record: logging.LogRecord) -> None:
    self.records.append(f"{record.levelname} - {record.getMessage()}")


def _in_worker(fn: Callable[..., Any], args: tuple) -> tuple[Any, list[str], str | None]:
  """Runs `fn(*args)` in a worker, with the root logger captured."""
  handler = _Collect()
  root = logging.getLogger()
  root.handlers[:] = [handler]
  root.setLevel(logging.INFO)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
      value, error = fn(*args), None
    except BaseException as e:  # The official tools raise anything; report it, do not die.
      value, error = None, f"{type(e).__name__}: {e}"
  notes = [f"WARNING - {w.message}" for w in caught]
  return value, handler.records + notes, error


def _serve(conn: Connection) -> None:
  """A worker's loop: one (fn, args) in, one `_in_worker` result out, until the pipe closes."""
  while True:
    try:
      fn, args = conn.recv()
    except (EOFError, OSError):
      return
    result = _in_worker(fn, args)
    try:
      conn.send(result)
    except Exception as e:  # noqa: BLE001 - a value that does not pickle: the tool's failure
      conn.send((None, result[1], f"{type(e).__name__} returning the result: {e}"))


class _Worker:
  """One worker process and the call it is running."""

  def __init__(self, ctx: Any):
    self.conn, child = ctx.Pipe()
    self.proc = ctx.Process(target=_serve, args=(child,), daemon=True)
    self.proc.start()
    child.close()
    self.index: int | None = None
    self.deadline = 0.0

  def start(self, index: int, fn: Callable[..., Any], args: tuple, timeout_s: float) -> None:
    self.index, self.deadline = index, time.monotonic() + timeout_s
    self.conn.send((fn, args))

  def kill(self) -> None:
    if self.proc.is_alive():
      self.proc.kill()
    self.proc.join()
    self.conn.close()


def crash_message(exitcode: int | None) -> str:
  """How a worker process ended, in words: its exit code, or the signal that killed it."""
  if exitcode is not None and exitcode < 0:
    try:
      name = signal.Signals(-exitcode).name
    except ValueError:
      name = "an unknown signal"
    return f"the worker process crashed: killed by {name} (signal {-exitcode})"
  return f"the worker process crashed: it exited with code {exitcode}"


def _reading(pid: int) -> str:
  """Which file a hung worker is reading, and near which line ('' when not knowable).

  Linux tells a process's open files and their offsets in /proc. Python reads a
  text file in 8 KiB chunks, so the line being worked on ends within the last
  chunk read: the line holding the byte 8 KiB before the offset is at or just
  before it.
  """
  try:
    for fd in os.listdir(f"/proc/{pid}/fd"):
      target = os.readlink(f"/proc/{pid}/fd/{fd}")
      if not target.startswith("/") or target.startswith(("/dev/", "/proc/")) \
          or target.endswith((".so", ".pyc", ".py")) or not os.path.isfile(target):
        continue
      with open(f"/proc/{pid}/fdinfo/{fd}") as f:
        pos = int(next(ln for ln in f if ln.startswith("pos:")).split()[1])
      with open(target, "rb") as f:
        line = _newlines(f, max(0, pos - 8192)) + 1
      return f" reading {os.path.basename(target)}, near line {line}"
  except (OSError, ValueError, StopIteration):
    pass
  return ""


def _newlines(f: Any, size: int) -> int:
  """Newlines in the first `size` bytes of `f`, read a MiB at a time."""
  count = 0
  while size > 0 and (chunk := f.read(min(size, 1 << 20))):
    count, size = count + chunk.count(b"\n"), size - len(chunk)
  return count


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
  """For its duration, SIGTERM raises `Interrupted` in the main thread, as Ctrl-C
  raises KeyboardInterrupt: the `finally` blocks that kill workers and remove
  temporary copies run, where the default action would end the process at once."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def stop(signum: int, _: Any) -> None:
    raise Interrupted(signum, f"interrupted by {signal.Signals(signum).name}; nothing was written")

  old = signal.signal(signal.SIGTERM, stop)
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, old)


class Isolated:
  """Worker processes for official tool calls, each call under a time limit.

  Calls run in parallel over `processes` workers. A call that outlives
  `timeout_s` has its worker killed (after noting which file and line it was
  reading); a worker that dies mid-call (a crash in C code, `os._exit`, the OOM
  killer) is reported with its exit code or signal. Either way only that call
  fails and a fresh worker takes its place.
  """

  def __init__(self, processes: int = 2, timeout_s: float = 120.0):
    self._processes = max(1, processes)
    self._timeout = timeout_s
    self._idle: list[_Worker] = []
    self._busy: list[_Worker] = []
    self._closed = False
    self._ctx = multiprocessing.get_context("spawn")  # nothing of the caller's JAX/TF state

  def __enter__(self) -> Isolated:
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()

  def close(self) -> None:
    """Kills every worker, a busy one too (a `map` in another thread then ends, its calls
    not made failing)."""
    self._closed = True
    for w in self._idle + self._busy:
      w.kill()
    self._idle = []

  def map(self, fn: Callable[..., Any], calls: Sequence[tuple],
          on_done: Callable[[int], None] | None = None, *, at_once: int = 0) -> list[Outcome]:
    """`fn(*args)` for every args tuple, results in order; `on_done(i)` as each ends;
    `at_once`: at most that many calls at a time (0: one per worker)."""
    out: list[Outcome | None] = [None] * len(calls)
    todo, busy = list(range(len(calls)))[::-1], self._busy
    try:
      while (todo or busy) and not self._closed:
        while todo and len(busy) < (at_once or self._processes):
          w = self._idle.pop() if self._idle else _Worker(self._ctx)
          i = todo.pop()
          w.start(i, fn, calls[i], self._timeout)
          busy.append(w)
        for w, outcome, healthy in self._wait(busy):
          busy.remove(w)
          out[w.index] = outcome
          if healthy:
            self._idle.append(w)
          else:
            w.kill()
          if on_done is not None:
            on_done(w.index)
    finally:
      for w in busy:
        w.kill()
      busy.clear()
    return [o or Outcome(error="not run: stopped") for o in out]

  def _wait(self, busy: list[_Worker]) -> list[tuple[_Worker, Outcome, bool]]:
    """Waits for calls to end, crash or run out of time; returns those that did, each
    with whether its worker can take another call."""
    soonest = min(w.deadline for w in busy)
    ready = set(connection.wait([w.conn for w in busy] + [w.proc.sentinel for w in busy],
                                timeout=max(0.0, soonest - time.monotonic())))
    now, done = time.monotonic(), []
    for w in busy:
      if w.conn in ready:
        try:
          value, messages, error = w.conn.recv()
          done.append((w, Outcome(value, tuple(messages), error), True))
          continue
        except (EOFError, OSError):
          w.proc.join(5)
      if w.conn in ready or w.proc.sentinel in ready:
        w.proc.join(5)
        done.append((w, Outcome(error=crash_message(w.proc.exitcode)), False))
      elif now >= w.deadline:
        where = _reading(w.proc.pid)
        done.append((w, Outcome(error=f"timed out after {self._timeout:g} s{where}"), False))
    return done

  def call(self, fn: Callable[..., Any], *args: Any) -> Outcome:
    return self.map(fn, [args])[0]


class _ParsedOnce:
  """The compliance checker's `yaml` module, whose load() parses each rule file once per
  worker: the checker reads its three or four YAML files again for every log, three
  quarters of its time (10 v5.0 logs: 0.65 s of 0.85 s). The same parse, a copy each use."""

  def __init__(self, yaml: Any):
    self._yaml, self._parsed = yaml, {}

  def __getattr__(self, name: str) -> Any:
    return getattr(self._yaml, name)

  def load(self, f: Any, Loader: Any) -> Any:  # noqa: N803 - yaml.load's own keyword
    key = (f.name, os.fstat(f.fileno()).st_mtime_ns, Loader)
    if key not in self._parsed:
      self._parsed[key] = self._yaml.load(f, Loader=Loader)
    return copy.deepcopy(self._parsed[key])


def _silence_checker_globals() -> None:
  from mlperf_logging.compliance_checker import mlp_compliance

  mlp_compliance.enqueued_configs.clear()  # Left over by an earlier crash in this worker.
  if not isinstance(mlp_compliance.yaml, _ParsedOnce):
    mlp_compliance.yaml = _ParsedOnce(mlp_compliance.yaml)


def _tool_compliance(path: str, usage: str, ruleset: str, config: str | None) -> dict[str, Any]:
  """The compliance checker on one log: verdict and its messages, by kind. (The lines
  its parser could not read are the ones mlbench.resultlog reports: not parsed twice.)"""
  from mlperf_logging.compliance_checker import mlp_compliance

  _silence_checker_globals()
  checker = mlp_compliance.make_checker(usage, ruleset, quiet=False, werror=False)
  valid, _, _, _ = mlp_compliance.main(path, config or f"{usage}_{ruleset}/common.yaml", checker)
  return {"valid": bool(valid), "errors": list(checker.overwritable.values())
          + list(checker.not_overwritable), "warnings": list(checker.warnings.values())}


def _tool_seeds(files: list[str], ruleset: str) -> bool:
  from mlperf_logging.package_checker.seed_checker import SeedChecker

  return bool(SeedChecker(ruleset).check_seeds(files))


def _tool_import(*modules: str) -> None:
  """Imports modules in a worker ahead of the calls that need them."""
  for name in modules:
    importlib.import_module(name)


def _tool_system(path: str, usage: str, ruleset: str) -> bool:
  from mlperf_logging.system_desc_checker import system_desc_checker

  return bool(system_desc_checker.check_system_desc(path, usage, ruleset)[0])
