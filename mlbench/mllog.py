"""The one place that writes MLPerf `:::MLLOG` lines (through mlperf_logging.mllog).

The loop gets an `MLLog` object and calls typed methods on it; workloads never
emit MLPerf keys. Values are converted to plain Python first: mllog silently
drops an event whose value is a JAX or TensorFlow scalar (it logs "Failed to
encode" and moves on), which would make a log fail the checker for no visible
reason. Only process 0 writes; on other processes `MLLog(None)` does nothing.

A line that cannot be written (a full disk, a mount gone read-only) stops the run: the
log is cut back to its last whole line, nothing more is written to it, and the write's
fault is raised as `StorageFailed` (`mlbench.storage.faults`), never printed by `logging`;
an error of the handler that is no storage fault is raised as itself (a bug).
"""

from __future__ import annotations

import enum
import logging
import numbers
import os
import re
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mlbench.storage import faults

# mllog records the caller's file and line in every line's metadata (the seed
# checker keys on them). The call chain is: caller -> MLLog method -> _emit ->
# MLLogger.event/start/end -> _log_helper -> get_caller; this offset makes mllog
# record the caller of the MLLog method.
_STACK_OFFSET = 3


def plain(value: Any) -> Any:
  """Converts a value to JSON-ready Python (int, float, str, bool, None, list).

  Raises:
    TypeError: for values mllog cannot encode.
  """
  if value is None or isinstance(value, (bool, str)):
    return value
  if isinstance(value, enum.Enum):
    return plain(value.value)
  if isinstance(value, (list, tuple)):
    return [plain(v) for v in value]
  if isinstance(value, numbers.Integral):
    return int(value)
  if isinstance(value, numbers.Real):
    return float(value)
  if hasattr(value, "shape") and hasattr(value, "dtype"):  # numpy, JAX, TF arrays
    arr = np.asarray(value)
    return plain(arr.item()) if arr.ndim == 0 else plain(arr.tolist())
  raise TypeError(f"cannot log a {type(value).__name__} as an MLPerf value: {value!r}")


class _Handler(logging.FileHandler):
  """A log file whose first failed write (a full disk, ...) is kept in `error`, not printed
  as logging does, and after which nothing more is written (mllog catches what a handler
  raises and would log a "Failed to encode" line instead)."""

  error: BaseException | None = None

  def emit(self, record: logging.LogRecord) -> None:
    if self.error is None:
      super().emit(record)

  def handleError(self, record: logging.LogRecord) -> None:
    self.error = self.error or sys.exc_info()[1]


class MLLog:
  """MLPerf result log of one run, written to `path` (None: log nothing).

  Every method takes an optional `time_ms`, the timestamp to record (from the
  run's device-synced clock); without it mllog reads the wall clock.
  """

  def __init__(self, path: Path | None, *, prefix: str = ""):
    """`prefix`: the log so far of a run that resumes (written first, then continued)."""
    self._path = path
    self._ml = None
    self._handler = None
    if path is None:
      return
    from mlperf_logging.mllog import mllog  # Deferred: keeps `mlbench --help` fast.

    logger = logging.getLogger(f"mlbench.mllog.{uuid.uuid4().hex}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
      with open(path, "x", encoding="utf-8") as f:  # "x": never continue someone else's file.
        f.write(prefix)
        f.flush()
    except OSError as e:
      if not isinstance(e, FileExistsError):  # Ours, and not whole: nothing half-written.
        Path(path).unlink(missing_ok=True)
      raise
    self._whole = len(prefix.encode("utf-8"))  # bytes of the log that are whole lines
    self._handler = self._file = _Handler(path, mode="a", encoding="utf-8")
    self._handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(self._handler)
    root = str(Path(__file__).resolve().parent.parent)
    self._ml = mllog.MLLogger(logger=logger, default_stack_offset=_STACK_OFFSET,
                              root_dir=re.escape(root))

  @property
  def path(self) -> Path | None:
    return self._path

  def close(self) -> None:
    if self._handler is not None:
      self._handler.close()
      self._handler = None

  def _emit(self, kind: str, key: str, value: Any = None,
            metadata: Mapping[str, Any] | None = None, time_ms: int | None = None) -> None:
    if self._ml is None:
      return
    if self._file.error is not None:  # A write failed: the run stops, its log stays whole.
      return
    meta = {k: plain(v) for k, v in (metadata or {}).items()} or None
    getattr(self._ml, kind)(key=key, value=plain(value), metadata=meta, time_ms=time_ms)
    if self._file.error is None:
      self._whole = os.path.getsize(self._path)
      return
    try:
      self._file.close()  # Flushes what is left, which may fail again.
    except OSError:
      pass
    self._handler = None
    os.truncate(self._path, self._whole)  # Whole lines only: the torn one goes.
    error = self._file.error
    fault = faults.diagnose(error, self._path)
    if fault is None:
      raise error  # No storage fault but a bug (for the crash report).
    raise fault.stop() from None

  # -- structure of a run ---------------------------------------------------
  def cache_clear(self, cleared: bool, time_ms: int | None = None) -> None:
    self._emit("event", "cache_clear", cleared, time_ms=time_ms)

  def init_start(self, time_ms: int | None = None) -> None:
    self._emit("start", "init_start", time_ms=time_ms)

  def init_stop(self, time_ms: int | None = None) -> None:
    self._emit("end", "init_stop", time_ms=time_ms)

  def run_start(self, time_ms: int | None = None) -> None:
    self._emit("start", "run_start", time_ms=time_ms)

  def run_stop(self, success: bool, time_ms: int | None = None) -> None:
    self._emit("end", "run_stop", metadata={"status": "success" if success else "aborted"},
               time_ms=time_ms)

  def block_start(self, first_epoch: float, epoch_count: float, samples: int,
                  time_ms: int | None = None) -> None:
    self._emit("start", "block_start", metadata={
        "first_epoch_num": first_epoch, "epoch_count": epoch_count, "samples_count": samples},
               time_ms=time_ms)

  def block_stop(self, first_epoch: float, samples: int, time_ms: int | None = None) -> None:
    self._emit("end", "block_stop", metadata={"first_epoch_num": first_epoch,
                                              "samples_count": samples}, time_ms=time_ms)

  def eval_start(self, epoch: float, samples: int, time_ms: int | None = None) -> None:
    self._emit("start", "eval_start", metadata={"epoch_num": epoch, "samples_count": samples},
               time_ms=time_ms)

  def eval_stop(self, epoch: float, samples: int, time_ms: int | None = None) -> None:
    self._emit("end", "eval_stop", metadata={"epoch_num": epoch, "samples_count": samples},
               time_ms=time_ms)

  def eval_result(self, key: str, value: float, epoch: float, samples: int,
                  time_ms: int | None = None) -> None:
    self._emit("event", key, value, metadata={"epoch_num": epoch, "samples_count": samples},
               time_ms=time_ms)

  # -- what was run ---------------------------------------------------------
  def submission(self, *, benchmark: str, org: str, division: str, status: str,
                 platform: str, time_ms: int | None = None) -> None:
    for key, value in (("submission_benchmark", benchmark), ("submission_org", org),
                       ("submission_division", division), ("submission_status", status),
                       ("submission_platform", platform)):
      self._emit("event", key, value, time_ms=time_ms)

  def seed(self, seed: int, time_ms: int | None = None) -> None:
    self._emit("event", "seed", int(seed), time_ms=time_ms)

  def hyperparameters(self, hparams: Mapping[str, Any], time_ms: int | None = None) -> None:
    from mlbench.workload import unpack

    for key, hparam in hparams.items():
      value, metadata = unpack(hparam)
      self._emit("event", key, value, metadata, time_ms=time_ms)

  def event(self, key: str, value: Any, metadata: Mapping[str, Any] | None = None,
            time_ms: int | None = None) -> None:
    """Any other POINT_IN_TIME key (disclosures, tracked statistics)."""
    self._emit("event", key, value, metadata, time_ms=time_ms)
