"""Keeping XLA's and libtpu's C++ messages off the terminal.

They write straight to file descriptor 2 (a RET_CHECK failure with a stack dump
when jaxlib cannot re-read a program libtpu wrote, warnings at first use), past
Python's `sys.stderr`. `captured()` points descriptor 2 at a temporary file for
the duration and hands back what was written, for the caller to sum up in one
line where it matters.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator


class Captured:
  """What was written to descriptor 2 inside `captured()` (filled on exit)."""

  text: str = ""

  def first_error(self) -> str:
    """The first line that reads like an error, shortened (e.g. the RET_CHECK message)."""
    for line in self.text.splitlines():
      if "RET_CHECK" in line or " INTERNAL:" in line or line.startswith("E"):
        return line.split("] ", 1)[-1][:200]
    return ""


@contextlib.contextmanager
def captured() -> Iterator[Captured]:
  out = Captured()
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile(mode="w+b") as tmp:
    os.dup2(tmp.fileno(), 2)
    try:
      yield out
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      tmp.seek(0)
      out.text = tmp.read().decode("utf-8", errors="replace")
