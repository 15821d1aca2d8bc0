"""The last resort: what the command line says about an exception nobody expected.

Bad input is a `UserError` (one line, exit code 2); anything else is a bug, in mlbench or
in a plugin. It is reported as the short traceback of the code that can be fixed, without
the frames of the libraries underneath (JAX, Flax, TensorFlow, click, the standard
library, ...), with the mlbench version and how to get everything
(`MLBENCH_DEBUG=1`), and exit code 70 (BSD's EX_SOFTWARE, an internal error), distinct
from a user error's 2 and a missed target's 1.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import traceback
from pathlib import Path

from mlbench import __version__

EXIT_CODE = 70
DEBUG_ENV = "MLBENCH_DEBUG"
LIBRARIES = ("jax", "jaxlib", "flax", "optax", "orbax", "chex", "tensorflow", "keras", "numpy",
             "ml_dtypes", "absl", "click", "rich", "etils", "mlperf_logging", "google",
             "tensorstore", "fsspec", "gcsfs", "yaml", "sklearn", "pycocotools", "sacrebleu",
             "tokenizers")
"""Packages whose frames a crash report leaves out (their own code is not the bug)."""
_JAX_NOTE = "--------------------\nFor simplicity, JAX has removed its internal frames"


def _library_dirs() -> tuple[str, ...]:
  """Folders whose files are library code: those packages, and the standard library."""
  dirs = [sysconfig.get_paths()["stdlib"]]
  for name in LIBRARIES:
    module = sys.modules.get(name)
    where = getattr(module, "__file__", None)
    if where:
      dirs.append(str(Path(where).parent))
  return tuple(str(Path(d).resolve()) + os.sep for d in dirs)


def _ours(frame: traceback.FrameSummary, libraries: tuple[str, ...]) -> bool:
  path = str(Path(frame.filename).resolve()) if frame.filename.startswith(os.sep) else ""
  return bool(path) and not path.startswith(libraries)


def report(error: BaseException) -> str:
  """The crash report of `error`: its type and message, the frames outside the libraries
  (the exception's causes too), the version and how to see the whole traceback."""
  libraries = _library_dirs()
  lines = [f"error: unexpected {type(error).__name__} (mlbench {__version__}, a bug: please "
           "report it)"]
  chain, seen = [], set()
  while error is not None and id(error) not in seen:  # the last raised first
    seen.add(id(error))
    chain.append(error)
    error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
  for i, exc in enumerate(reversed(chain)):
    frames = traceback.extract_tb(exc.__traceback__)
    kept = [f for f in frames if _ours(f, libraries)]
    if i:
      lines.append("which caused:" if exc.__cause__ is not None else "while handling it:")
    lines += [f'  File "{f.filename}", line {f.lineno}, in {f.name}\n    {f.line}'.rstrip()
              for f in kept]
    if len(kept) < len(frames):
      lines.append(f"  ({len(frames) - len(kept)} frames of libraries left out)")
    message = "".join(traceback.format_exception_only(exc)).rstrip()
    lines.append(message.split(_JAX_NOTE)[0].rstrip())  # MLBENCH_DEBUG=1 unfilters JAX too
  lines.append(f"the whole traceback: run the same command again with {DEBUG_ENV}=1")
  return "\n".join(lines)


def debugging() -> bool:
  """Whether the user asked for whole tracebacks (MLBENCH_DEBUG=1); then JAX's own frames
  stay in them too (JAX_TRACEBACK_FILTERING=off, read when JAX first traces)."""
  if os.environ.get(DEBUG_ENV, "") in ("", "0"):
    return False
  os.environ.setdefault("JAX_TRACEBACK_FILTERING", "off")
  return True


def handle(error: Exception) -> int:
  """Prints the crash report (or, with MLBENCH_DEBUG=1, the whole traceback) on stderr;
  returns the exit code."""
  if debugging():
    traceback.print_exception(error, file=sys.stderr)
    print(f"mlbench {__version__}", file=sys.stderr)
  else:
    print(report(error), file=sys.stderr)
  return EXIT_CODE
