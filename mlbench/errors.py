"""The error type for bad input: the CLI prints its message on one line, exit code 2."""

from __future__ import annotations


class UserError(Exception):
  """Bad input from the user: the message names the problem and the fix.

  The CLI turns it into a one-line `error: ...` on stderr and exit code 2,
  without a traceback. Raise it for anything the user can correct (an unknown
  workload, a config key that does not exist, a missing dataset, ...), never for
  bugs.
  """


def choices(names) -> str:
  """Formats valid choices for an error message: 'a, b, c'."""
  return ", ".join(sorted(str(n) for n in names))


class Interrupted(BaseException):
  """The run was stopped by a signal (SIGTERM, SIGINT); the CLI exits 128 + `signum`.

  A BaseException, like KeyboardInterrupt, so `except Exception` in library
  code never swallows it. `message` is the one line the CLI prints: what was
  kept and how to resume.
  """

  def __init__(self, signum: int, message: str = ""):
    super().__init__(message or f"interrupted by signal {signum}")
    self.signum = signum
    self.message = message or f"interrupted by signal {signum}"


class StorageFailed(Exception):
  """A write the run cannot do without failed: a full disk, a refused write, a quota, a
  read-only mount, a bucket's error after retries. The CLI prints `message` (one line: the
  cause, what was kept, the `--resume` command that continues the run) and exits
  `EXIT_CODE`, distinct from a missed target (1), bad input (2) and a bug (70).

  Args:
    cause: what failed and where, e.g. "disk full at /r/runs: 0.0 MiB free".
    fix: what the user does about it, e.g. "free space".
    message: the whole line, once the run has kept what it could (else `cause`).
  """

  EXIT_CODE = 75  # BSD's EX_TEMPFAIL: a temporary failure, to be tried again (resumed).

  def __init__(self, cause: str, fix: str = "", message: str = ""):
    super().__init__(message or cause)
    self.cause, self.fix, self.message = cause, fix, message or cause

  @property
  def final(self) -> bool:
    """Whether `message` already says what was kept and how to go on."""
    return self.message != self.cause
