"""What `--resume PATH` continues: the run record, and the clash checks.

Light on purpose (no JAX): the CLI resolves `--resume` before JAX starts, so a
wrong path or a clashing option fails at once, before any compile.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from mlbench import paths
from mlbench.config import Division, RunConfig
from mlbench.errors import UserError

RUN_FILE = "run.json"
FINISHED_FILE = "finished.json"


@dataclasses.dataclass(frozen=True)
class RunRecord:
  """What a run is, so that `--resume` continues the same one."""

  run_id: str
  workload: str
  config: str | None
  overrides: tuple[str, ...]
  seeds: tuple[int, ...]   # of every run of the invocation
  index: int               # which of them this is
  system: str
  submitter: str
  division: str
  ruleset: str
  results_dir: str
  checkpoint_every: int

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=2) + "\n"

  @classmethod
  def from_json(cls, text: str) -> RunRecord:
    d = json.loads(text)
    d["overrides"], d["seeds"] = tuple(d["overrides"]), tuple(d["seeds"])
    return cls(**d)


def find_run(path: paths.PathLike) -> tuple[RunRecord, paths.Path]:
  """The run record and checkpoint folder behind a `--resume PATH`.

  PATH may be the run folder (`runs/<system>/<benchmark>/<run id>`) or its
  checkpoint folder, on a disk or in a bucket, seen from any host.

  Raises:
    UserError: PATH holds no run record, the run finished, or it has no checkpoint.
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
  except (OSError, ValueError, TypeError, KeyError) as e:
    raise UserError(f"--resume {path}: {folder / RUN_FILE} is unreadable ({e})") from None
  if (folder / FINISHED_FILE).is_file():
    done = json.loads((folder / FINISHED_FILE).read_text())
    raise UserError(f"--resume {path}: that run already finished ({done.get('log')}); start a "
                    "new run instead")
  if not any(p.name.isdigit() for p in folder.iterdir() if p.is_dir()):
    raise UserError(f"--resume {path}: the run was stopped before its first checkpoint; "
                    "start it again")
  return record, folder


# Options a resumed run takes from its record: (RunConfig field, click parameter,
# how the user spells it). Giving one with another value is a clash.
_FIXED = (("config", "config_name", "--config"), ("overrides", "overrides", "--set"),
          ("seed", "seed", "--seed"), ("system", "system", "--system"),
          ("submitter", "submitter", "--submitter"), ("division", "division", "--division"),
          ("ruleset", "ruleset", "--ruleset"), ("results_dir", "results_dir", "--results-dir"),
          ("runs", "runs", "--runs"), ("checkpoint_dir", "checkpoint_dir", "--checkpoint-dir"))


def _stored(record: RunRecord, folder: paths.Path, field: str) -> Any:
  return {"config": record.config, "overrides": record.overrides,
          "seed": record.seeds[record.index], "system": record.system,
          "submitter": record.submitter, "division": Division(record.division),
          "ruleset": record.ruleset, "results_dir": paths.path(record.results_dir),
          "runs": len(record.seeds), "checkpoint_dir": folder}[field]


def _same(field: str, given: Any, stored: Any) -> bool:
  if field in ("results_dir", "checkpoint_dir"):
    return paths.same(given, stored) or paths.same(given, paths.path(stored).parent)
  return given == stored


def resumed_config(rc: RunConfig, path: paths.PathLike, given: set[str]) -> RunConfig:
  """`rc` for continuing the run at `path`: its settings from the record.

  Args:
    given: the click parameters the user set (on the command line or in the
      environment); any of them that disagrees with the record is a clash.

  Raises:
    UserError: nothing to resume at `path`, another workload, or a clash.
  """
  record, folder = find_run(path)
  if rc.workload != record.workload:
    raise UserError(f"--resume {path} is a {record.workload} run, not {rc.workload}; run "
                    f"`mlbench run {record.workload} --resume {path}`")
  for field, param, option in _FIXED:
    if param in given and not _same(field, getattr(rc, field), _stored(record, folder, field)):
      raise UserError(f"{option} {getattr(rc, field)} clashes with the run being resumed "
                      f"({_stored(record, folder, field)}); leave {option} out")
  every = rc.checkpoint_every if "checkpoint_every" in given else record.checkpoint_every
  return dataclasses.replace(
      rc, config=record.config, overrides=record.overrides, seed=record.seeds[record.index],
      system=record.system, submitter=record.submitter, division=Division(record.division),
      ruleset=record.ruleset, results_dir=paths.path(record.results_dir), checkpoint_every=every,
      checkpoint_dir=None, resume=folder)
