"""What `--resume PATH` continues: the run record, and what may differ from it.

Light on purpose (no JAX): the CLI resolves `--resume` before JAX starts, so a
wrong path or a differing setting fails at once, before any compile.

`run.json`, written once when a run starts, records every setting that changes
training or the result: the workload, its config (a name, or a file and the sha256
of its content) and overrides, the seeds, precision, input mode, mesh,
weight-update sharding, batch-norm groups, data dir, ruleset, division, system,
submitter and results dir, the mlbench, jax, jaxlib and libtpu versions, the
process count and the workload config as it was resolved. A resumed run takes
each setting from the record; an option given with another value, or another
version installed, is refused, one line per difference, each saying what to do.
The device count may differ (a checkpoint reshards onto another mesh), and with it
the mesh's `data` axis; its other axes may not. Once JAX runs, the runner checks
the process count and the resolved config (`plan_differences`).

`--results-dir` with `--resume` names where the run's results go now: honoured when
the run's checkpoints are in its folder there (`runs/<system>/<benchmark>/<run id>`:
a results folder moved or mounted elsewhere) or kept elsewhere (`--checkpoint-dir`),
refused when the run's folder is in another results dir. Without it, a run whose
folder moved with its results dir is refused with where to point it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from mlbench.storage import paths
from mlbench.config import Division, InputMode, RunConfig
from mlbench.errors import UserError
from mlbench.train.lifecycle.runrecord import RunRecord, digest, find_run, text, versions

DATA_MANIFEST = "mlbench-data.json"  # what `mlbench data prepare` writes (datasets.shards)


@dataclasses.dataclass(frozen=True)
class _Setting:
  """A recorded option: its RunConfig field, the click parameters that set it, its
  spelling, its recorded value, how two values compare and how one is shown."""

  field: str
  params: tuple[str, ...]
  option: str
  stored: Callable[[RunRecord, paths.Path], Any]
  same: Callable[[Any, Any], bool] = lambda a, b: a == b
  show: Callable[[Any], str] = str


def _same_config(given: Any, stored: Any) -> bool:
  if isinstance(given, str) and isinstance(stored, str) and stored.endswith(".py"):
    return paths.same(given, stored)
  return given == stored


def _other_axes(mesh: Any) -> dict[str, int]:
  """A mesh without its data axis, which follows the device count."""
  return {a: n for a, n in (mesh or ()) if a != "data" and n != 1}


def _same_data(given: Any, stored: Any) -> bool:
  """The same folder, or a copy of a prepared set (the same manifest) elsewhere."""
  if paths.same(given, stored):
    return True
  try:
    return (paths.path(given) / DATA_MANIFEST).read_bytes() == (
        paths.path(stored) / DATA_MANIFEST).read_bytes()
  except Exception:  # No manifest on either side (or unreadable): not the same data.
    return False


def _show_mesh(mesh: Any) -> str:
  return ",".join(f"{a}={n}" for a, n in mesh) if mesh else "every device on data"


SETTINGS = (
    _Setting("config", ("config_name",), "--config", lambda r, f: r.config, _same_config,
             lambda v: v or "the default"),
    _Setting("overrides", ("overrides", "init_checkpoint"), "--set",
             lambda r, f: r.overrides, show=lambda v: " ".join(v) or "none"),
    _Setting("seed", ("seed",), "--seed", lambda r, f: r.seeds[r.index]),
    _Setting("system", ("system",), "--system", lambda r, f: r.system),
    _Setting("submitter", ("submitter",), "--submitter", lambda r, f: r.submitter),
    _Setting("division", ("division",), "--division", lambda r, f: Division(r.division),
             show=lambda v: v.value),
    _Setting("ruleset", ("ruleset",), "--ruleset", lambda r, f: r.ruleset),
    _Setting("runs", ("runs",), "--runs", lambda r, f: len(r.seeds)),
    _Setting("checkpoint_dir", ("checkpoint_dir",), "--checkpoint-dir", lambda r, f: f,
             lambda a, b: paths.same(a, b) or paths.same(a, paths.path(b).parent)),
    _Setting("precision", ("precision",), "--precision", lambda r, f: r.precision,
             show=lambda v: v or "the config's own"),
    _Setting("input_mode", ("input_mode",), "--input-mode",
             lambda r, f: InputMode(r.input_mode), show=lambda v: v.value),
    _Setting("mesh", ("mesh",), "--mesh", lambda r, f: r.mesh,
             lambda a, b: _other_axes(a) == _other_axes(b), _show_mesh),
    _Setting("weight_update_sharding", ("weight_update_sharding",),
             "--weight-update-sharding", lambda r, f: r.weight_update_sharding,
             show=lambda v: "on" if v else "off"),
    _Setting("bn_group_size", ("bn_group_size",), "--bn-group-size",
             lambda r, f: r.bn_group_size, show=lambda v: "the whole batch" if v is None
             else str(v)),
    _Setting("data_dir", ("data_dir",), "--data-dir", lambda r, f: paths.path(r.data_dir),
             _same_data),
)


def _option_differences(rc: RunConfig, record: RunRecord, folder: paths.Path,
                        given: set[str]) -> list[str]:
  out = []
  for s in SETTINGS:
    value, stored = getattr(rc, s.field), s.stored(record, folder)
    if set(s.params) & given and not s.same(value, stored):
      out.append(f"{s.option} {s.show(value)}: the run used {s.show(stored)}; leave "
                 f"{s.option} out")
  return out


def _environment_differences(record: RunRecord) -> list[str]:
  out = []
  for dist, now in versions().items():
    then = record.versions.get(dist, "none")
    if now != then:
      fix = f"pip uninstall {dist}" if then == "none" else f"pip install {dist}=={then}"
      out.append(f"{dist} {now}: the run used {then}; {fix}")
  if record.config_sha256 is not None:
    now = digest(record.config)
    if now is None:
      out.append(f"--config {record.config}: no such file now; restore it (sha256 "
                 f"{record.config_sha256[:12]}...)")
    elif now != record.config_sha256:
      out.append(f"--config {record.config}: changed since the run started (sha256 "
                 f"{record.config_sha256[:12]}... then, {now[:12]}... now); restore it")
  return out


def plan_differences(record: RunRecord, resolved: dict[str, Any],
                     process_count: int) -> list[str]:
  """What the runner checks once JAX runs: the process count (each host reads its own
  share of the data) and the workload config as this mlbench resolves it."""
  out = []
  if process_count != record.process_count:
    out.append(f"{process_count} process(es): the run used {record.process_count}; run it on "
               f"{record.process_count} (the devices per process may differ)")
  now = {k: text(v) for k, v in resolved.items()}
  keys = sorted(set(now) | set(record.resolved_config))
  for k in [k for k in keys if now.get(k) != record.resolved_config.get(k)][:8]:
    out.append(f"config {k} = {now.get(k, 'absent')}: the run used "
               f"{record.resolved_config.get(k, 'absent')}; resume with what the run used")
  return out


def refusal(path: paths.PathLike, problems: list[str]) -> str:
  """The message of a refused resume: a line saying so, then one line per difference."""
  return (f"--resume {path}: this run would differ from the one it continues (below, with "
          "what to do); fix each or start a new run without --resume:\n  "
          + "\n  ".join(problems))


def _home(record: RunRecord, folder: paths.Path) -> paths.Path | None:
  """The results dir whose run folder holds the checkpoint folder `folder` (the default,
  `<results>/runs/<system>/<benchmark>/<run id>/checkpoints`), wherever it is now; None for
  checkpoints kept elsewhere (--checkpoint-dir)."""
  parts = paths.path(folder).parts
  if parts[-5:] != ("runs", record.system, record.benchmark, record.run_id, "checkpoints"):
    return None
  return paths.path(folder).parents[4]


def _results_dir(rc: RunConfig, record: RunRecord, folder: paths.Path,
                 given: set[str]) -> tuple[paths.Path, str | None]:
  """Where the resumed run files its result (see the module docstring), or why not."""
  stored, home = paths.path(record.results_dir), _home(record, folder)
  where = f"runs/{record.system}/{record.benchmark}/{record.run_id}"
  if "results_dir" in given and not paths.same(rc.results_dir, stored):
    if home is None or paths.same(rc.results_dir, home):
      return rc.results_dir, None
    return stored, (f"--results-dir {rc.results_dir}: the run's folder ({where}) is in {home}; "
                    f"give --results-dir {home}, where the results moved, or leave it out")
  if home is None or paths.same(home, stored):
    return stored, None
  return stored, (f"the run's folder ({where}) is in {home} now, not in its results dir "
                  f"{stored}; give --results-dir {home}, where the results moved")


def resumed_config(rc: RunConfig, path: paths.PathLike, given: set[str]) -> RunConfig:
  """`rc` for continuing the run at `path`: its settings from the record.

  Args:
    given: the click parameters the user set (on the command line or in the
      environment); any of them that disagrees with the record is refused.

  Raises:
    UserError: nothing to resume at `path`, another workload, a difference, or a
      live run holding the run folder.
  """
  from mlbench.train.lifecycle import lease

  record, folder = find_run(path)
  if rc.workload != record.workload:
    raise UserError(f"--resume {path} is a {record.workload} run, not {rc.workload}; run "
                    f"`mlbench run {record.workload} --resume {path}`")
  results_dir, problem = _results_dir(rc, record, folder, given)
  problems = [*_option_differences(rc, record, folder, given),
              *_environment_differences(record), *([problem] if problem else [])]
  if problems:
    raise UserError(refusal(path, problems))
  lease.check(folder, stale_after=rc.stale_after, what=f"--resume {path}")
  every = rc.checkpoint_every if "checkpoint_every" in given else record.checkpoint_every
  # The record's values, but a data dir or mesh given: a copy of the same data elsewhere,
  # a mesh whose data axis follows another device count.
  kept = {s.field: getattr(rc, s.field) if s.field in ("data_dir", "mesh") and
          set(s.params) & given else s.stored(record, folder) for s in SETTINGS}
  for field in ("runs", "checkpoint_dir"):
    kept.pop(field)
  return dataclasses.replace(rc, **kept, results_dir=results_dir, checkpoint_every=every,
                             checkpoint_dir=None, resume=folder)


def fit_mesh(mesh: tuple[tuple[str, int], ...] | None,
             devices: int) -> tuple[tuple[str, int], ...] | None:
  """A resumed run's mesh on `devices` devices: the recorded axes, the data axis resized
  to the devices the others leave (the resharding case); as it is where that fails."""
  if not mesh:
    return mesh
  others = 1
  for axis, n in mesh:
    others *= 1 if axis == "data" else n
  if devices % others or dict(mesh).get("data", 1) * others == devices:
    return mesh
  return (("data", devices // others), *((a, n) for a, n in mesh if a != "data"))
