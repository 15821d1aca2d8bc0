"""Fault injection at the OS boundary for a run in its own process: writes to chosen paths
fail as the kernel fails them when a permission is taken away (EACCES) or a mount goes
read-only (EROFS), where the tests cannot do that for real (they run as root, whom file
permissions do not stop).

An audit hook (PEP 578) sees every file a Python-level call opens, creates, links or renames
(the run's own writes, orbax's metadata and etils' writes under it) and raises the errno for
a write whose path matches `MLBENCH_TEST_DENY="ERRNO:REGEX"`; everything else, and every
read, goes through. TensorStore's writes from C++ are not seen: a checkpoint save still
fails, at orbax's first file of it. Start the run with `COMMAND`, the `mlbench` command line
with the hook installed.
"""

from __future__ import annotations

import errno
import os
import re
import sys

ENV = "MLBENCH_TEST_DENY"
COMMAND = (sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv.pop(1)); "
           "import deny_writes; deny_writes.install(); from mlbench.cli import main; "
           "sys.exit(main())", os.path.dirname(os.path.abspath(__file__)))
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _writes(event: str, args: tuple) -> str | None:
  """The path an audited call writes to (None: it writes nothing, or not by path)."""
  if event == "open":
    path, mode, flags = args
    writing = (any(c in mode for c in "wax+") if isinstance(mode, str)
               else isinstance(flags, int) and flags & _WRITE_FLAGS)
    return path if writing else None
  if event in ("os.mkdir", "os.link", "os.rename", "os.symlink"):
    return args[1] if event in ("os.link", "os.rename", "os.symlink") else args[0]
  return None


def install() -> None:
  """Installs the hook that `MLBENCH_TEST_DENY` asks for (none without it)."""
  spec = os.environ.get(ENV)
  if not spec:
    return
  name, pattern = spec.split(":", 1)
  code, wanted = getattr(errno, name), re.compile(pattern)

  def hook(event: str, args: tuple) -> None:
    path = _writes(event, args)
    if isinstance(path, (str, bytes, os.PathLike)) and wanted.search(os.fsdecode(path)):
      raise OSError(code, os.strerror(code), os.fsdecode(path))

  sys.addaudithook(hook)
