"""The record of a run, `run.json`: what `--resume` continues, and finding it.

Written once, when a run that checkpoints starts, into its checkpoint folder: every
setting that changes training or the result (see `mlbench.train.lifecycle.resume` for what a
resumed run may and may not change). Light on purpose (no JAX).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlbench.storage import paths
from mlbench.errors import UserError

if TYPE_CHECKING:
  from mlbench.train.plan import Plan

RUN_FILE = "run.json"
FINISHED_FILE = "finished.json"
VERSIONED = ("mlbench", "jax", "jaxlib", "libtpu")


@dataclasses.dataclass(frozen=True)
class RunRecord:
  """What a run is, so that `--resume` continues the same one."""

  run_id: str
  workload: str
  config: str | None       # a config name, or the absolute path of a config file
  overrides: tuple[str, ...]
  seeds: tuple[int, ...]   # of every run of the invocation
  index: int               # which of them this is
  system: str
  submitter: str
  division: str
  ruleset: str
  results_dir: str
  checkpoint_every: int
  benchmark: str
  config_sha256: str | None  # of a config file's content
  precision: str | None
  input_mode: str
  mesh: tuple[tuple[str, int], ...] | None
  weight_update_sharding: bool
  bn_group_size: int | None
  data_dir: str
  process_count: int
  versions: dict[str, str]
  resolved_config: dict[str, str]  # the workload config as it ran, key -> JSON value

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=1) + "\n"

  @classmethod
  def from_json(cls, text: str) -> RunRecord:
    d = json.loads(text)
    names = [f.name for f in dataclasses.fields(cls)]
    missing = [n for n in names if n not in d] if isinstance(d, dict) else names
    if missing:
      raise ValueError(f"it does not record {', '.join(missing[:4])}"
                       f"{', ...' if len(missing) > 4 else ''} (an older mlbench wrote it)")
    d["overrides"], d["seeds"] = tuple(d["overrides"]), tuple(d["seeds"])
    d["mesh"] = None if d["mesh"] is None else tuple((a, int(n)) for a, n in d["mesh"])
    return cls(**{n: d[n] for n in names})


def versions() -> dict[str, str]:
  """The installed versions of what decides the numbers ("none": not installed)."""
  def one(dist: str) -> str:
    try:
      return metadata.version(dist)
    except metadata.PackageNotFoundError:
      return "none"
  return {d: one(d) for d in VERSIONED}


def text(value: Any) -> str:
  return json.dumps(value, sort_keys=True, default=str)


def digest(config: str | None) -> str | None:
  if not config or not config.endswith(".py") or not Path(config).is_file():
    return None
  return hashlib.sha256(Path(config).read_bytes()).hexdigest()


def new_record(plan: Plan, run_id: str, seeds: tuple[int, ...], index: int) -> RunRecord:
  """The record of a run of `plan` (a `mlbench.train.plan.Plan`) starting now."""
  from mlbench import config as config_lib

  rc, cfg_file = plan.rc, digest(plan.rc.config)
  return RunRecord(
      run_id=run_id, workload=plan.workload.name,
      config=str(Path(rc.config).resolve()) if cfg_file else rc.config,
      overrides=tuple(rc.overrides), seeds=tuple(seeds), index=index, system=plan.system,
      submitter=rc.submitter, division=rc.division.value, ruleset=plan.rule.ruleset,
      results_dir=str(paths.resolve(rc.results_dir)), checkpoint_every=rc.checkpoint_every,
      benchmark=plan.workload.benchmark, config_sha256=cfg_file, precision=rc.precision,
      input_mode=rc.input_mode.value, mesh=rc.mesh,
      weight_update_sharding=rc.weight_update_sharding, bn_group_size=rc.bn_group_size,
      data_dir=str(paths.resolve(plan.data_dir)), process_count=plan.runtime.process_count,
      versions=versions(),
      resolved_config={k: text(v) for k, v in config_lib.flatten(plan.cfg).items()})


def find_run(path: paths.PathLike) -> tuple[RunRecord, paths.Path]:
  """The run record and checkpoint folder behind a `--resume PATH`.

  PATH may be the run folder (`runs/<system>/<benchmark>/<run id>`) or its
  checkpoint folder, on a disk or in a bucket, seen from any host.

  Raises:
    UserError: PATH holds no usable run record, the run finished, or it has no checkpoint.
  """
  path = paths.require_dir(path, "--resume")
  with paths.errors("--resume", path):
    return _find_run(path)


def _find_run(path: paths.Path) -> tuple[RunRecord, paths.Path]:
  for folder in (path, path / "checkpoints"):
    if (folder / RUN_FILE).is_file():
      break
  else:
    raise UserError(f"--resume {path}: no {RUN_FILE} there; give the run folder an "
                    "interrupted run named (runs/<system>/<benchmark>/<run id>)")
  try:
    record = RunRecord.from_json((folder / RUN_FILE).read_text())
  except (ValueError, TypeError, KeyError) as e:
    raise UserError(f"--resume {path}: {folder / RUN_FILE} cannot be used ({e}); start a "
                    "new run") from None
  if (folder / FINISHED_FILE).is_file():
    try:
      done = json.loads((folder / FINISHED_FILE).read_text())
      log = done["log"]
    except (ValueError, TypeError, KeyError):  # Damaged; written only once the log was filed.
      log = f"its {FINISHED_FILE} says so but is damaged"
    raise UserError(f"--resume {path}: that run already finished ({log}); start a new run "
                    "instead")
  if not any(p.name.isdigit() for p in folder.iterdir() if p.is_dir()):
    raise UserError(f"--resume {path}: the run was stopped before its first checkpoint; "
                    "start it again")
  return record, folder
