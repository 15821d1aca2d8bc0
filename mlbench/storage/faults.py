"""Storage faults: what a failed write means, in a few words, and what to do about it.

A run writes where space, permissions and networks fail: a disk fills up, a quota is
reached, an NFS server goes read-only, a bucket refuses a write (HTTP 403) or answers
429 and 503 under load. Every client involved raises its own kind of error: the OS an
`OSError` with an errno, TensorStore (orbax's array writer) a `ValueError` whose text
starts with a status code and carries the errno or the HTTP code, google-cloud-storage
a `GoogleAPICallError` with `code`, gcsfs an `HttpError` or an `OSError("Forbidden")`.
`diagnose` reads them all into one `Fault`; an error that is none of these is a bug and
gets no diagnosis (it goes on to the crash report). `needed` turns the fault of a write
the run cannot do without into `StorageFailed`, whose line the CLI prints.

Transient bucket errors (429, 5xx) are retried with exponential backoff by the clients'
own policies, never by a loop of ours: google-cloud-storage's `DEFAULT_RETRY` (1 s
doubling to 60 s, for up to 120 s; `gcs_retry` is that policy), gcsfs's `retry_request`
(6 tries; `watch_gcsfs`), TensorStore's `gcs_request_retries`. The first retry of the
process is said once on stderr (`retrying`); what still fails after them is a fault.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import re
import shutil
import sys
import threading
from collections.abc import Iterator
from typing import Any

from mlbench.errors import StorageFailed

# errno -> (what happened, what to do).
_ERRNO = {
    errno.ENOSPC: ("disk full", "free space"),
    errno.EDQUOT: ("disk quota exceeded", "free space or raise the quota"),
    errno.EROFS: ("read-only file system", "make it writable (remount it read-write)"),
    errno.EACCES: ("permission denied", "make it writable"),
    errno.EPERM: ("operation not permitted", "make it writable"),
    errno.EIO: ("I/O error", "check the disk"),
}
_TEXT = {"No space left on device": errno.ENOSPC, "Disk quota exceeded": errno.EDQUOT,
         "Read-only file system": errno.EROFS, "Permission denied": errno.EACCES}
# TensorStore's status codes of storage that fails, which begin the text of its errors
# (INVALID_ARGUMENT, FAILED_PRECONDITION, ... are a caller's bugs, not storage faults).
_STATUS = ("RESOURCE_EXHAUSTED", "PERMISSION_DENIED", "UNAVAILABLE", "DEADLINE_EXCEEDED",
           "ABORTED", "UNAUTHENTICATED", "DATA_LOSS")
_HTTP = {401: "unauthenticated", 403: "permission denied", 404: "not found",
         408: "request timeout", 429: "rate limited", 500: "internal error",
         502: "bad gateway", 503: "service unavailable", 504: "gateway timeout"}
_CLIENTS = ("google", "gcsfs", "fsspec", "aiohttp", "requests", "tensorstore", "tensorflow")


@dataclasses.dataclass(frozen=True)
class Fault:
  """A failed write, for people: `cause` ("disk full at /r: 0.0 MiB free"), `fix` ("free
  space"), and whether trying again later may work by itself (`transient`)."""

  cause: str
  fix: str
  transient: bool = False

  def stop(self, message: str = "") -> StorageFailed:
    """This fault as the exception that stops a run (`message`: the whole line)."""
    return StorageFailed(self.cause, self.fix, message)

  def stop_after(self, what: str) -> StorageFailed:
    """The exception that stops a run after `what` ("3 saves in a row failed")."""
    return StorageFailed(f"{self.cause} ({what})", self.fix)


def free_mib(where: Any) -> float | None:
  """MiB free on the disk that holds `where` (or its nearest existing parent); None for a
  bucket or a path whose disk cannot be asked."""
  p = os.fspath(where)
  if "://" in p:
    return None
  p = os.path.abspath(p)
  while not os.path.exists(p) and os.path.dirname(p) != p:
    p = os.path.dirname(p)
  try:
    return shutil.disk_usage(p).free / 2**20
  except OSError:
    return None


def _errno_fault(code: int, where: str, detail: str = "") -> Fault:
  what, fix = _ERRNO.get(code, (detail or os.strerror(code), f"check {where}"))
  if code == errno.ENOSPC:
    free = free_mib(where)
    return Fault(f"disk full at {where}" + ("" if free is None else f": {free:.1f} MiB free"),
                 fix)
  return Fault(f"{what} at {where}", fix)


def _http_fault(code: int, where: str) -> Fault:
  name = f"{_HTTP.get(code, 'error')} (HTTP {code})"
  if code in (401, 403):
    return Fault(f"{name} at {where}", "give this account write access to it")
  if code == 404:
    return Fault(f"{name}: {where}", "check that the bucket exists")
  transient = code in (408, 429) or code >= 500
  return Fault(f"{name} at {where}" + (", still after retries with backoff" if transient else ""),
               "try again later" if transient else f"check {where}", transient)


def _code(e: BaseException) -> Any:
  """The HTTP status of a client's error (google's exceptions have `code`, the upload
  library's the `response`)."""
  code = getattr(e, "code", None)
  return code if code is not None else getattr(getattr(e, "response", None), "status_code",
                                                None)


def _one(e: BaseException, where: str) -> Fault | None:
  """The fault `e` itself says (not its causes)."""
  if isinstance(e, OSError) and e.errno is not None:
    return _errno_fault(e.errno, where, e.strerror or "")
  code = _code(e)
  module = type(e).__module__.split(".")[0]
  if isinstance(code, int) and 400 <= code < 600 and module in _CLIENTS:
    return _http_fault(int(code), where)
  text = str(e)
  m = re.search(r"os_error_code='(\d+)'", text)  # TensorStore's local file errors
  if m:
    return _errno_fault(int(m[1]), where)
  m = re.search(r"HTTP response code:? (\d{3})", text)  # TensorStore's, TensorFlow's GCS
  if m:
    return _http_fault(int(m[1]), where)
  for words, code in _TEXT.items():
    if words in text and (isinstance(e, OSError) or text.startswith(_STATUS)
                          or module in _CLIENTS):
      return _errno_fault(code, where)
  if isinstance(e, OSError) and "Forbidden" in text:  # gcsfs's 403
    return _http_fault(403, where)
  if isinstance(e, OSError) or text.startswith(_STATUS):
    first = text.split(" [tensorstore_spec=", 1)[0].splitlines()[0] if text else type(e).__name__
    return Fault(f"{first[:160]} at {where}", f"check {where}")
  return None


def _storage_error(e: BaseException) -> bool:
  """Whether `e` is an error storage raises: an OSError, or a storage client's own type."""
  return isinstance(e, OSError) or type(e).__module__.split(".")[0] in _CLIENTS


def diagnose(e: BaseException, where: Any) -> Fault | None:
  """The storage fault `e` is, a failed write to `where`; None when it is not one (a bug).

  Only what storage raises is a fault: an OSError, a client's own error (TensorStore's
  status errors, google-cloud-storage's, gcsfs's), or a client's error raised from
  another (`raise ... from`: the cause names the fault). Anything else is a bug, even one
  raised while a storage error was being handled (its `__context__` is not followed).
  """
  where = os.fspath(where)
  seen: set[int] = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    fault = _one(e, where)
    if fault is not None:
      return fault
    if not _storage_error(e):
      return None
    e = e.__cause__
  return None


@contextlib.contextmanager
def needed(where: Any) -> Iterator[None]:
  """A write to `where` the run cannot do without: its storage fault raises
  `StorageFailed` (one line); any other error passes on unchanged."""
  try:
    yield
  except StorageFailed:
    raise
  except Exception as e:
    fault = diagnose(e, where)
    if fault is None:
      raise
    raise fault.stop() from None


# -- retries ----------------------------------------------------------------------
_said = threading.Event()


def _what(e: BaseException) -> str:
  code = _code(e)
  return f"HTTP {int(code)}" if isinstance(code, int) else type(e).__name__


def retrying(what: str, where: str, policy: str) -> None:
  """A client retries after `what` ("HTTP 503"): said once per process, on stderr."""
  if _said.is_set():
    return
  _said.set()
  print(f"note: {where} answered {what}; retrying with backoff ({policy}); further retries "
        "are not reported", file=sys.stderr, flush=True)


def gcs_retry(where: str) -> Any:
  """google-cloud-storage's own `DEFAULT_RETRY` (which errors, how long, what backoff),
  saying once that it retries."""
  from google.cloud.storage import retry

  base = retry.DEFAULT_RETRY

  def predicate(e: Exception) -> bool:
    again = base._predicate(e)  # The policy's own judgement of the error.
    if again:
      retrying(_what(e), where, "google-cloud-storage's DEFAULT_RETRY")
    return again

  return base.with_predicate(predicate)


class _GcsfsRetries(logging.Handler):
  """gcsfs logs each retry at DEBUG ("... retrying after exception: ..."): say the first.
  Its ERROR records (out of retries, not retriable) go nowhere: the error itself comes
  back to mlbench, which says it in one line."""

  def emit(self, record: logging.LogRecord) -> None:
    message = record.getMessage()
    if "retrying after exception" in message:
      code = re.search(r"\b([45]\d\d)\b", message)
      retrying(f"HTTP {code[1]}" if code else "an error", "the bucket", "gcsfs's retry_request")


_watching = False


def watch_gcsfs() -> None:
  """Once per process: gcsfs's retries said once, its tracebacks kept off the console."""
  global _watching
  if _watching:
    return
  _watching = True
  logger = logging.getLogger("gcsfs")
  logger.addHandler(_GcsfsRetries())
  logger.setLevel(logging.DEBUG)
  logger.propagate = False
