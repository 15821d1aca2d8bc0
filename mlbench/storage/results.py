"""The MLPerf submission layout: result logs and system descriptions.

    <results_dir>/systems/<system>.json
    <results_dir>/results/<system>/<benchmark>/result_<i>.txt

so `python -m mlperf_logging.package_checker <results_dir> training <ruleset>`
runs on `<results_dir>`, which may be a local folder, a mount shared by hosts
or a bucket (`gs://...`). A run logs into a pending file next to the results and
publishes it as the lowest free `result_<i>.txt` (`storage.pending`), never
overwriting one. What goes into `systems/<system>.json` is `mlbench.system`'s.
"""

from __future__ import annotations

import re
import secrets

from etils import epath

from mlbench.storage import paths


def benchmark_dir(results_dir: paths.PathLike, system: str, benchmark: str) -> epath.Path:
  """`<results_dir>/results/<system>/<benchmark>`, checked to stay inside `results_dir`.

  Raises:
    UserError: a name is not one safe path component, or the folder resolves
      (through a link) outside `results_dir`.
  """
  folder = (paths.path(results_dir) / "results" / paths.check_name("system name", system)
            / paths.check_name("benchmark name", benchmark))
  paths.inside(results_dir, folder)
  return folder


def system_file(results_dir: paths.PathLike, system: str) -> epath.Path:
  """`<results_dir>/systems/<system>.json`, checked like `benchmark_dir`."""
  path = paths.path(results_dir) / "systems" / f"{paths.check_name('system name', system)}.json"
  paths.inside(results_dir, path)
  return path


def new_run_id() -> str:
  """8 hex digits of a 31-bit number: it survives a broadcast as a JAX int32."""
  return f"{secrets.randbits(31):08x}"


def run_folder(results_dir: paths.PathLike, system: str, benchmark: str, rid: str) -> epath.Path:
  """`<results_dir>/runs/<system>/<benchmark>/<run id>`: one run's checkpoints and,
  if it was interrupted, its partial log. Outside `results/`, so the package
  checks never see it."""
  folder = (paths.path(results_dir) / "runs" / paths.check_name("system name", system)
            / paths.check_name("benchmark name", benchmark) / paths.check_name("run id", rid))
  paths.inside(results_dir, folder)
  return folder


def result_files(folder: paths.PathLike) -> list[epath.Path]:
  """`result_<i>.txt` files in a benchmark folder, by index."""
  folder = paths.path(folder)
  found = [p for p in folder.glob("result_*.txt") if re.fullmatch(r"result_\d+\.txt", p.name)]
  return sorted(found, key=lambda p: int(p.stem.split("_")[1]))
