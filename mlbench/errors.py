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
