"""Finding result logs in what a user points at: a log, a benchmark folder, a package.

MLPerf layout: `<org>/systems/<system>.json` and
`<org>/results/<system>/<benchmark>/result_<i>.txt` (an mlbench results folder
is one). A path may be one log, one `<benchmark>` folder, one `<system>` folder (its
benchmark folders), a `results` folder, an `<org>` package, or a folder of packages (a
round's results repository).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from mlbench.errors import UserError
from mlbench.resultlog import is_log

_RESULT = re.compile(r"result_.*\.txt", re.DOTALL)  # glob's result_*.txt


@dataclasses.dataclass(frozen=True)
class BenchmarkDir:
  """`results/<system>/<benchmark>`: the runs of one benchmark on one system."""

  folder: Path
  system: str
  benchmark: str
  files: tuple[Path, ...]
  package: Path | None  # the <org> folder holding systems/, if there is one

  @property
  def system_file(self) -> Path | None:
    return None if self.package is None else self.package / "systems" / f"{self.system}.json"


@dataclasses.dataclass(frozen=True)
class Target:
  """What validate or compare was pointed at."""

  path: Path
  kind: str  # log | benchmark | system | results | package | packages
  log: Path | None = None
  benchmarks: tuple[BenchmarkDir, ...] = ()
  packages: tuple[Path, ...] = ()


def result_files(folder: Path) -> tuple[Path, ...]:
  """A benchmark folder's run logs: every `result_*.txt`, as the official package checker
  and result_summarizer glob them (v0.7 Intel's are `result_1_1n4r_32k_1592751389.txt`),
  numbered runs in the order of their numbers."""
  found = [p for p in folder.iterdir() if p.is_file() and _RESULT.fullmatch(p.name)]
  return tuple(sorted(found, key=_run_number))


def _run_number(path: Path) -> tuple[int, int, str]:
  head = path.stem.split("_")[1]
  return (0, int(head), path.name) if head.isdigit() else (1, 0, path.name)


def _benchmark_dir(folder: Path, package: Path | None) -> BenchmarkDir:
  return BenchmarkDir(folder, folder.parent.name, folder.name, result_files(folder), package)


def _package_of_results(results: Path) -> Path | None:
  parent = results.parent
  return parent if results.name == "results" and (parent / "systems").is_dir() else None


def _in_results(results: Path) -> tuple[BenchmarkDir, ...]:
  package = _package_of_results(results)
  return tuple(_benchmark_dir(b, package) for s in sorted(results.iterdir()) if s.is_dir()
               for b in sorted(s.iterdir()) if b.is_dir())


def _is_results_folder(folder: Path) -> bool:
  return any(result_files(b) for s in folder.iterdir() if s.is_dir()
             for b in s.iterdir() if b.is_dir())


def find(path: Path) -> Target:
  """Classifies `path` and lists its benchmark folders.

  Raises:
    UserError: nothing there is an MLPerf log or submission, or it cannot be read.
  """
  path = Path(path)
  try:
    return _classify(path, _kind(path))
  except OSError as e:  # A folder inside that cannot be listed, say.
    raise UserError(f"{e.filename or path} cannot be read ({e.strerror})") from None


def _classify(path: Path, kind: str) -> Target:
  if kind == "file":
    if not is_log(path):
      raise UserError(f"{path} is not an MLPerf result log (it has no :::MLLOG lines)")
    return Target(path, "log", log=path)
  if result_files(path):
    package = _package_of_results(path.parent.parent)
    return Target(path, "benchmark", benchmarks=(_benchmark_dir(path, package),))
  benchmarks = [b for b in sorted(path.iterdir()) if b.is_dir()]
  if any(result_files(b) for b in benchmarks):  # results/<system>: its benchmark folders
    package = _package_of_results(path.parent)
    return Target(path, "system", benchmarks=tuple(_benchmark_dir(b, package) for b in benchmarks),
                  packages=(package,) if package else ())
  if (path / "results").is_dir():
    return Target(path, "package", benchmarks=_in_results(path / "results"), packages=(path,))
  packages = tuple(p for p in sorted(path.iterdir()) if p.is_dir() and (p / "results").is_dir())
  if packages:
    return Target(path, "packages", benchmarks=tuple(b for p in packages
                                                       for b in _in_results(p / "results")),
                  packages=packages)
  if _is_results_folder(path):
    package = _package_of_results(path)
    return Target(path, "results", benchmarks=_in_results(path),
                  packages=(package,) if package else ())
  raise UserError(f"{path} holds no MLPerf result logs; give a log, a "
                  "results/<system>[/<benchmark>] folder or a submission package "
                  "(a folder with results/ and systems/)")


_SPECIAL = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
            (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"))


def _kind(path: Path) -> str:
  """'file' or 'dir', or a UserError saying what `path` is instead."""
  try:
    mode = os.stat(path).st_mode
  except OSError as e:
    if e.errno == errno.ELOOP:
      raise UserError(f"{path} is a loop of symbolic links; point at the log or folder "
                      "itself") from None
    if os.path.islink(path):
      raise UserError(f"{path} is a symbolic link to {os.readlink(path)}, which does not "
                      "exist") from None
    if e.errno == errno.ENOENT:
      raise UserError(f"{path} does not exist") from None
    raise UserError(f"{path} cannot be read ({e.strerror})") from None
  if stat.S_ISREG(mode):
    return "file"
  if stat.S_ISDIR(mode):
    return "dir"
  what = next((name for test, name in _SPECIAL if test(mode)), "not a regular file")
  raise UserError(f"{path} is {what}, not a result log or a folder; give a log, a "
                  "results/<system>/<benchmark> folder or a submission package")


def groups(target: Target) -> dict[Path, list[BenchmarkDir]]:
  """Benchmark folders by the package (or folder) whose runs decide their ruleset."""
  out: dict[Path, list[BenchmarkDir]] = {}
  for bench in target.benchmarks:
    out.setdefault(bench.package or bench.folder, []).append(bench)
  return out


def read_system(path: Path | None) -> tuple[dict[str, Any] | None, str | None]:
  """A system description, or None and why not (None, None without a path)."""
  if path is None:
    return None, None
  if not path.is_file():
    return None, f"{path} is {'not a regular file' if path.exists() else 'missing'}"
  try:
    desc = json.loads(read_text(path))
  except UserError as e:
    return None, str(e)
  except json.JSONDecodeError as e:
    return None, f"{path} is not valid JSON: {e}"
  if not isinstance(desc, dict):
    return None, (f"{path} holds a JSON {type(desc).__name__}, not an object; a system "
                  "description is an object of fields (system_name, division, status, ...)")
  return desc, None


MAX_TEXT_BYTES = 1 << 20  # system descriptions and such have a few KB


def read_text(path: Path) -> str:
  """A small text file of a package, as UTF-8.

  Raises:
    UserError: it cannot be read, is over a MiB, or is not UTF-8 text (binary, say).
  """
  try:
    if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the read
      raise UserError(f"{path} is not a regular file")
    with open(path, "rb") as f:
      data = f.read(MAX_TEXT_BYTES + 1)
    if len(data) > MAX_TEXT_BYTES:
      raise UserError(f"{path} is over {MAX_TEXT_BYTES // 2**20} MiB; such a file has a few KB")
    return data.decode("utf-8")
  except OSError as e:
    raise UserError(f"{path} cannot be read ({e.strerror})") from None
  except UnicodeDecodeError as e:
    raise UserError(f"{path} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset "
                    f"{e.start})") from None
