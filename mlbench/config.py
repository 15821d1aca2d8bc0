"""Configs: the harness's `RunConfig`, and typed overrides of a workload config.

A workload config is a tree of frozen dataclasses built by a Python function
(`get_config()` style, as in big_vision and the flax examples). The CLI edits it
with dotted `KEY=VALUE` overrides (`--set optimizer.base_learning_rate=2.0`):
each value is parsed as the type the field declares, and an unknown key or a
value of the wrong type is an error that lists what is valid.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.util
import os
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mlbench.storage import paths
from mlbench.errors import UserError, choices
from mlbench.fields import ConfigError, DType
from mlbench.workload import Workload

STALE_AFTER_S = 1800.0
"""`--stale-after`: 30 min without a heartbeat (`storage.pending.HEARTBEAT_S`, 30 s) and another
host's pending log counts as abandoned; above any checkpoint interval too."""


class Division(enum.Enum):
  """MLPerf division: closed enforces the rules' hyperparameter constraints."""

  CLOSED = "closed"
  OPEN = "open"


class InputMode(enum.Enum):
  """deterministic: the same batches for the same seed; fast: tf.data hands out
  whichever element is ready first."""

  DETERMINISTIC = "deterministic"
  FAST = "fast"


MESH_AXES = ("data", "model", "expert", "spatial", "stage")


def parse_mesh(text: str) -> tuple[tuple[str, int], ...]:
  """'data=4,model=2' -> (('data', 4), ('model', 2))."""
  out = []
  for part in text.split(","):
    name, sep, size = part.strip().partition("=")
    if not sep or name not in MESH_AXES or not size.isdigit() or int(size) < 1:
      raise UserError(f"--mesh expects AXIS=SIZE,... with axes {', '.join(MESH_AXES)}; "
                      f"got '{text}'")
    if name in dict(out):
      raise UserError(f"--mesh names axis '{name}' twice")
    out.append((name, int(size)))
  return tuple(out)


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
  """GPipe's schedule for a `stage` mesh axis: the harness's `pipeline.*` keys.

  Attributes:
    microbatches: each batch (of every gradient-accumulation step) flows through the
      stages as this many microbatches: a multiple of the stage count that divides
      every data-parallel replica's examples. 0: as many as there are stages.
  """

  microbatches: int = 0


@dataclasses.dataclass(frozen=True)
class HarnessConfig:
  """The `--set` sections the harness owns, whatever the workload (`pipeline.*`)."""

  pipeline: PipelineConfig = PipelineConfig()


def split_overrides(assignments: Sequence[str]) -> tuple[tuple[str, ...], HarnessConfig]:
  """(the workload config's assignments, the harness's sections with theirs applied)."""
  sections = {f.name for f in dataclasses.fields(HarnessConfig)}
  ours = [a for a in assignments if a.partition(".")[0].strip() in sections]
  return (tuple(a for a in assignments if a not in ours),
          override(HarnessConfig(), ours))


def configured(workload: Workload, name_or_path: str | None,
               assignments: Sequence[str]) -> tuple[str, Any, HarnessConfig]:
  """The one place a request's config is read (`run`, `check`): the config's name, the
  workload config with its `--set` keys applied, and the harness's sections with theirs
  (`pipeline.microbatches`), which no workload config has."""
  name, cfg = load(workload, name_or_path)
  ours, harness = split_overrides(assignments)
  return name, override(cfg, ours), harness


def compile_cache_dir(value: str | os.PathLike | None = None) -> paths.Path | None:
  """The folder of JAX's persistent compilation cache for a `--compile-cache` value.

  None or "": the default, JAX_COMPILATION_CACHE_DIR if set (JAX's own setting),
  else `<paths.default_cache_dir()>/jax`; "off": no cache; anything else: that folder
  (or bucket: `gs://...`, which every host of a pod can share).
  """
  if value is None or str(value) == "":
    jax_dir = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    value = jax_dir or paths.default_cache_dir() / "jax"
  elif str(value).lower() == "off":
    return None
  if paths.is_remote(value):
    return paths.path(value, "--compile-cache")
  return paths.path(Path(value).expanduser().absolute())


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """Everything `mlbench run` was asked to do, apart from the workload config.

  Attributes:
    workload: registered workload name.
    config: config name (`mini`, `full`, ...) or path to a Python file whose
      `get_config()` returns the workload's config dataclass.
    overrides: dotted `KEY=VALUE` edits of the workload config.
    data_dir: where datasets are read from (and generated, for mini configs).
    results_dir: the submission folder: `systems/` and `results/` go in it.
      Every path may be a bucket (`gs://...`), an `etils.epath.Path`.
    system: system description name; None derives one from the machine.
    seed: seed of the first run (run i uses seed + i); None draws each run's
      seed from the OS entropy pool, as MLPerf closed division requires.
    runs: how many independent runs to perform.
    ruleset: rules version (`4.0.0`, `0.7.0`, `mini`); None picks the config's
      default (mini configs: `mini`; others: the newest official ruleset).
    division: closed or open.
    submitter: the organisation logged as `submission_org`.
    cpu_devices: simulate this many CPU devices (a pod on one host); None
      keeps the platform's devices.
    clear_caches: drop the OS page cache before each run (needs root), as the
      MLPerf rules require of submissions; logged as `cache_clear`.
    mesh: device mesh axes and sizes ((('data', 4), ('model', 2))); None puts
      every device on `data`.
    weight_update_sharding: shard the optimizer state and the weight update
      over the data-parallel replicas (Xu et al. 2020).
    bn_group_size: batch-norm statistics over groups of this many data-parallel
      devices (None: as the config's `model.bn_group_examples` says, else over the
      whole global batch).
    input_mode: deterministic or fast input pipelines.
    coordinator, num_processes, process_id: jax.distributed settings for a
      multi-host run (None: auto-detected on TPU pods and SLURM, else 1 process).
    checkpoint_every: save a checkpoint every this many steps (0: never).
    checkpoint_dir: where checkpoints go (None: each run's folder under
      `<results_dir>/runs/`).
    resume: the checkpoint folder of the interrupted run to continue.
    stale_after: seconds without a heartbeat after which a pending log of
      another host's run counts as abandoned (this host's: once its process
      is gone).
    precision: float32 or bfloat16 for the model's matmuls and activations (the
      config's `model.dtype`); None: bfloat16 for full configs on TPUs and GPUs,
      the config's own elsewhere.
    profile: (first step, steps) to trace with jax.profiler into the run folder.
    save_rate: bytes/s a host writes a checkpoint at, for the saves' deadline (None:
      assumed, then measured on the run's first save).
  """

  workload: str
  config: str | None = None
  overrides: tuple[str, ...] = ()
  data_dir: paths.Path = dataclasses.field(
      default_factory=lambda: paths.path(paths.default_cache_dir() / "data"))
  results_dir: paths.Path = paths.path("results")
  system: str | None = None
  seed: int | None = None
  runs: int = 1
  ruleset: str | None = None
  division: Division = Division.CLOSED
  submitter: str = "mlbench"
  cpu_devices: int | None = None
  clear_caches: bool = False
  mesh: tuple[tuple[str, int], ...] | None = None
  weight_update_sharding: bool = False
  bn_group_size: int | None = None
  input_mode: InputMode = InputMode.DETERMINISTIC
  coordinator: str | None = None
  num_processes: int | None = None
  process_id: int | None = None
  checkpoint_every: int = 0
  checkpoint_dir: paths.Path | None = None
  resume: paths.Path | None = None
  precision: str | None = None
  compile_cache: paths.Path | None = dataclasses.field(default_factory=compile_cache_dir)
  stale_after: float = STALE_AFTER_S
  profile: tuple[int, int] | None = None
  save_rate: float | None = None

  def __post_init__(self):
    # Paths given as strings or pathlib paths (tests, notebooks) become epath paths.
    for name in ("data_dir", "results_dir", "checkpoint_dir", "resume", "compile_cache"):
      value = getattr(self, name)
      if value is not None and not isinstance(value, paths.Path):
        object.__setattr__(self, name, paths.path(value))


PRECISIONS = tuple(d.value for d in DType)


def load(workload: Workload, name_or_path: str | None) -> tuple[str, Any]:
  """Builds a workload config by name or from a Python file.

  Returns:
    (name, config): the config's name (the file stem for a path) and value.
  """
  name = name_or_path or workload.default_config
  if name in workload.configs:
    return name, workload.configs[name]()
  path = Path(name)
  if path.suffix != ".py":
    raise UserError(f"unknown config '{name}' for {workload.name}; choose one of: "
                    f"{choices(workload.configs)}, or give a path to a .py file")
  if not path.is_file():
    raise UserError(f"config file {path} does not exist; give an existing .py file "
                    f"or one of: {choices(workload.configs)}")
  return path.stem, _from_file(workload, path)


def _from_file(workload: Workload, path: Path) -> Any:
  spec = importlib.util.spec_from_file_location(f"mlbench_config_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except Exception as e:  # A user file can fail in any way; report it on one line.
    raise UserError(f"config file {path} failed to load: {type(e).__name__}: {e}") from e
  if not hasattr(module, "get_config"):
    raise UserError(f"config file {path} has no get_config(); define one that returns "
                    f"a {workload.name} config")
  cfg = module.get_config()
  expected = type(workload.configs[workload.default_config]())
  if type(cfg) is not expected:
    raise UserError(f"{path}: get_config() returned {type(cfg).__name__}, expected "
                    f"{expected.__module__}.{expected.__name__}")
  return cfg


def override(cfg: Any, assignments: Sequence[str]) -> Any:
  """Applies dotted `KEY=VALUE` assignments to a frozen dataclass tree.

  Every section with a changed field is built once, with all of its new values (a later
  assignment of a key wins), so the section's own checks (`mlbench.fields`) see the final
  combination whatever the order of the assignments; their errors name the full key.
  """
  changes: dict[tuple[str, ...], tuple[str, str]] = {}
  for text in assignments:
    key, sep, value = text.partition("=")
    if not sep or not key:
      raise UserError(f"--set expects KEY=VALUE, got '{text}'")
    changes[tuple(key.strip().split("."))] = (value.strip(), key.strip())
  return _apply(cfg, changes, "") if changes else cfg


def _apply(node: Any, changes: dict[tuple[str, ...], tuple[str, str]], prefix: str) -> Any:
  """`node` with `changes` ({path below node: (value, full key)}) applied, built once."""
  fields = {f.name: f for f in dataclasses.fields(node)}
  values: dict[str, Any] = {}
  sections: dict[str, dict[tuple[str, ...], tuple[str, str]]] = {}
  for (head, *rest), (value, full_key) in changes.items():
    if head not in fields:
      raise UserError(f"unknown config key '{full_key}'; valid keys here: {choices(fields)}")
    current = getattr(node, head)
    if rest:
      if not dataclasses.is_dataclass(current):
        raise UserError(f"config key '{full_key}': '{head}' is a value, not a section")
      sections.setdefault(head, {})[tuple(rest)] = (value, full_key)
    elif dataclasses.is_dataclass(current):
      sub = ", ".join(f"{head}.{f.name}" for f in dataclasses.fields(current))
      raise UserError(f"config key '{full_key}' is a section; set one of: {sub}")
    else:
      values[head] = parse_value(value, typing.get_type_hints(type(node))[head], full_key)
  for head, sub_changes in sections.items():
    values[head] = _apply(getattr(node, head), sub_changes, f"{prefix}{head}.")
  try:
    return dataclasses.replace(node, **values)
  except ConfigError as e:
    raise e.under(prefix) from None


def parse_value(text: str, hint: Any, key: str = "value") -> Any:
  """Parses `text` as the type `hint` (int, float, bool, str, Enum, tuples, optionals)."""
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if origin in (typing.Union, types.UnionType):
    if text.lower() in ("none", "null") and type(None) in args:
      return None
    inner = [a for a in args if a is not type(None)]
    return parse_value(text, inner[0], key)
  if origin is tuple:
    parts = [p for p in text.strip("()[] ").split(",") if p.strip()]
    if len(args) == 2 and args[1] is Ellipsis:
      return tuple(parse_value(p.strip(), args[0], key) for p in parts)
    if len(parts) != len(args):
      raise UserError(f"{key} needs {len(args)} comma-separated values, got '{text}'")
    return tuple(parse_value(p.strip(), a, key) for p, a in zip(parts, args))
  if isinstance(hint, type) and issubclass(hint, enum.Enum):
    by_value = {str(m.value): m for m in hint}
    if text in by_value:
      return by_value[text]
    raise UserError(f"{key} must be one of: {choices(by_value)}; got '{text}'")
  if hint is bool:
    if text.lower() in ("true", "1", "yes"):
      return True
    if text.lower() in ("false", "0", "no"):
      return False
    raise UserError(f"{key} must be true or false; got '{text}'")
  if hint in (int, float):
    try:
      return hint(text) if hint is float else int(text, 0)
    except ValueError:
      raise UserError(f"{key} must be an {hint.__name__}; got '{text}'") from None
  if hint in (str, Path):
    return hint(text)
  raise UserError(f"{key} has type {hint}, which --set cannot parse")


def flatten(cfg: Any, prefix: str = "") -> dict[str, Any]:
  """{'optimizer.base_learning_rate': 2.0, ...} for a dataclass tree."""
  out: dict[str, Any] = {}
  for f in dataclasses.fields(cfg):
    value = getattr(cfg, f.name)
    key = f"{prefix}{f.name}"
    if dataclasses.is_dataclass(value):
      out.update(flatten(value, key + "."))
    else:
      out[key] = value.value if isinstance(value, enum.Enum) else value
  return out
