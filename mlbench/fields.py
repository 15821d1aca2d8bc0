"""What every workload config shares: its enums, its checks, and the fields the harness reads.

Workload configs are trees of frozen dataclasses (see `mlbench.config`). Each one checks
its own cross-field constraints in `__post_init__` with the helpers here, which raise a
`ConfigError` naming the `--set` key and what is valid, so a bad combination is one line
before anything is traced, not a `ValueError` from inside jit. `mlbench.config.override`
builds each changed section once, with all of its `--set` values, and puts the section's
path in front of the key (`attention_chunk` -> `model.attention_chunk`).

Every top-level config extends `WorkloadConfig` (or `EpochConfig`), which owns its
sections and the batch sizes and their checks. A few fields mean the same in every config that has them, and the
harness reads or sets them by their typed value (`Field`): the compute dtype
(`--precision`), the remat policy and scanned layers (hints in messages), the examples per
batch-norm group. Fields marked as architecture switches (`switch`) are refused away from
the reference by closed runs under MLPerf rules. This module imports nothing heavy.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from typing import Any, Generic, TypeVar

from mlbench.errors import UserError

T = TypeVar("T")


class DType(enum.Enum):
  """The dtype of activations and matmuls (parameters stay float32)."""

  FLOAT32 = "float32"
  BFLOAT16 = "bfloat16"


class Remat(enum.Enum):
  """What each layer keeps for the backward pass (`jax.checkpoint` per layer)."""

  NONE = "none"  # keep every activation (fastest, most memory)
  DOTS = "dots"  # keep matmul outputs without batch dims, recompute the rest
  FULL = "full"  # keep only each layer's input, recompute the layer in the backward pass


class AttentionImpl(enum.Enum):
  """Which implementation computes attention (`mlbench.train.attention`): chosen per
  platform and shape, or forced (a forced one that cannot serve a shape is an error)."""

  AUTO = "auto"      # the fused kernel where it can serve the shape, XLA elsewhere
  XLA = "xla"        # XLA's own (unfused: the L x S scores are materialised)
  CUDNN = "cudnn"    # cuDNN's fused flash attention (GPUs)
  PALLAS = "pallas"  # the Pallas TPU kernels: splash attention, flash attention with a bias


class LrScaling(enum.Enum):
  """How a learning rate given for `base_batch_size` moves to the global batch
  (`mlbench.train.optim.scale_for_batch`)."""

  NONE = "none"
  LINEAR = "linear"  # base_learning_rate * batch / base_batch_size
  LEGW = "legw"      # You et al. 2019: sqrt(k) rate, k times the warmup


class ConfigError(UserError):
  """A config value outside what is valid: `key` is its `--set` key below the section the
  check ran in; `problem` says what is wrong and what to set instead, naming the other
  keys it involves (`related`, below the same section) as they are."""

  def __init__(self, key: str, problem: str, related: tuple[str, ...] = ()):
    super().__init__(f"{key}: {problem}")
    self.key, self.problem, self.related = key, problem, related

  def under(self, section: str) -> ConfigError:
    """The same error, raised by a section that sits at `section` ("model."): its key and
    the related keys its problem names get the section in front."""
    problem = self.problem
    for name in self.related:
      problem = re.sub(rf"(?<![\w.]){re.escape(name)}\b", section + name, problem)
    return ConfigError(f"{section}{self.key}", problem,
                       tuple(section + name for name in self.related))


def require(ok: bool, key: str, problem: str, *related: str) -> None:
  """Raises ConfigError(key, problem, related) unless `ok`."""
  if not ok:
    raise ConfigError(key, problem, related)


def at_least(node: Any, minimum: float, *names: str) -> None:
  """Each named field of `node` is `minimum` or more."""
  for name in names:
    value = getattr(node, name)
    require(value >= minimum, name, f"{value} is below {minimum}; set {minimum} or more")


def positive(node: Any, *names: str) -> None:
  """Each named field of `node` is above 0 (rates, epsilons, norms, epochs)."""
  for name in names:
    value = getattr(node, name)
    require(value > 0, name, f"{value} is not positive; set a value above 0")


def fraction(node: Any, *names: str) -> None:
  """Each named field of `node` is a probability in [0, 1) (dropout rates)."""
  for name in names:
    value = getattr(node, name)
    require(0 <= value < 1, name, f"{value} is not in [0, 1)")


def interval(node: Any, name: str, low: float, high: float = float("inf")) -> None:
  """Field `name` of `node` is a range (lo, hi) with low < lo <= hi <= high."""
  lo, hi = getattr(node, name)
  require(low < lo <= hi <= high, name, f"{(lo, hi)} is no range within ({low}, {high}]")


def divides(node: Any, part: str, whole: str) -> None:
  """Field `part` of `node` divides field `whole` (heads into width)."""
  p, w = getattr(node, part), getattr(node, whole)
  require(p >= 1 and w % p == 0, part,
          f"{p} does not divide {whole} ({w}); set a divisor of {w}", whole)


def same_length(node: Any, *names: str) -> None:
  """The named tuple fields of `node` have one length (one entry per stage or map)."""
  lengths = {name: len(getattr(node, name)) for name in names}
  first = names[0]
  for name in names[1:]:
    require(lengths[name] == lengths[first], name,
            f"has {lengths[name]} entries, {first} has {lengths[first]}; give one per "
            f"entry of {first}", first)


def remat_choices(node: Any, *allowed: Remat) -> None:
  """`node.remat` is one of the policies this model implements."""
  require(node.remat in allowed, "remat",
          f"{node.remat.value} is not implemented here; set one of: "
          + ", ".join(r.value for r in allowed))


ModelT = TypeVar("ModelT")  # a workload's model section
DataT = TypeVar("DataT")  # its data section
OptimizerT = TypeVar("OptimizerT")  # its optimizer section


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkloadConfig(Generic[ModelT, DataT, OptimizerT]):
  """The top of every workload config, which extends it with the types of its own sections
  (`BertConfig(WorkloadConfig[ModelConfig, DataConfig, OptimizerConfig])`) and any fields
  of its own. The batch sizes are checked here, once for every workload. No field has a
  default: `full()` and `mini()` each give every value.

  Attributes:
    model: the model's section (`--set model.KEY=VALUE`).
    data: the dataset's section.
    optimizer: the optimizer's and its schedule's section.
    global_batch_size: examples per training step over all devices and hosts.
    eval_batch_size: examples per evaluation step over all devices and hosts.
  """

  model: ModelT
  data: DataT
  optimizer: OptimizerT
  global_batch_size: int
  eval_batch_size: int

  def __post_init__(self):
    at_least(self, 1, "global_batch_size", "eval_batch_size")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EpochConfig(WorkloadConfig[ModelT, DataT, OptimizerT]):
  """A `WorkloadConfig` whose training budget is `train_epochs` epochs of the training
  set: the schedule's length, at which a run short of its target is aborted."""

  train_epochs: float

  def __post_init__(self):
    super().__post_init__()
    positive(self, "train_epochs")


@dataclasses.dataclass(frozen=True)
class Field(Generic[T]):
  """A field the harness reads or sets wherever a config has it with the type it expects.

  Attributes:
    key: its dotted `--set` key.
    type: the type of its value; a field of the same name with another type (a plugin's
      own dtype enum) counts as absent.
  """

  key: str
  type: type[T]

  def get(self, cfg: Any) -> T | None:
    """The field's value; None where the config has no such field of this type."""
    node = cfg
    for part in self.key.split("."):
      if not dataclasses.is_dataclass(node) or part not in {f.name for f in
                                                             dataclasses.fields(node)}:
        return None
      node = getattr(node, part)
    return node if isinstance(node, self.type) else None

  def set(self, cfg: Any, value: T) -> Any:
    """A copy of `cfg` with the field set to `value` (the config's checks run again)."""
    if self.get(cfg) is None:
      raise UserError(f"this config has no `{self.key}` of type {self.type.__name__}")
    return _replace(cfg, self.key.split("."), value, "")


def _replace(node: Any, path: list[str], value: Any, prefix: str) -> Any:
  head = path[0]
  if len(path) > 1:
    value = _replace(getattr(node, head), path[1:], value, f"{prefix}{head}.")
  try:
    return dataclasses.replace(node, **{head: value})
  except ConfigError as e:
    raise e.under(prefix) from None


def switch(reference: Any) -> Any:
  """A config field that picks another architecture than the benchmark's model (BoT50's
  attention blocks in ResNet-50): its default is the reference's value, and a closed run
  under an MLPerf round's rules refuses any other (`switched`)."""
  return dataclasses.field(default=reference, metadata={"switch": True})


def provisional(value: Any, why: str) -> Any:
  """A config field whose default has no source yet (`why` says what is missing): while a
  config keeps that value, `describe` and `check`'s time to train say it is provisional."""
  return dataclasses.field(default=value, metadata={"provisional": why})


def _marked(cfg: Any, mark: str, prefix: str = "") -> list[tuple[str, Any, Any, Any]]:
  """(key, value, default, the mark's note) of each field of the tree `cfg` with `mark`."""
  out = []
  for f in dataclasses.fields(cfg):
    value = getattr(cfg, f.name)
    if dataclasses.is_dataclass(value):
      out += _marked(value, mark, f"{prefix}{f.name}.")
    elif mark in f.metadata:
      out.append((f"{prefix}{f.name}", value, f.default, f.metadata[mark]))
  return out


def _shown(value: Any) -> Any:
  return value.value if isinstance(value, enum.Enum) else value


def switched(cfg: Any) -> list[tuple[str, Any, Any]]:
  """(key, value, reference value) of each `switch` field of `cfg` set away from its
  reference value, enums as their values."""
  return [(key, _shown(value), _shown(default))
          for key, value, default, _ in _marked(cfg, "switch") if value != default]


def provisionals(cfg: Any) -> dict[str, tuple[Any, str]]:
  """{key: (value, what its source lacks)} of each `provisional` field of `cfg` still at
  its unsourced default."""
  return {key: (_shown(value), why) for key, value, default, why in _marked(cfg, "provisional")
          if value == default}


BN_GROUP_EXAMPLES = Field("model.bn_group_examples", int)
"""Examples a batch-norm group normalises over (0: the whole global batch); the harness
turns it into groups of data-parallel devices unless --bn-group-size says otherwise."""


PRECISION = Field("model.dtype", DType)
REMAT = Field("model.remat", Remat)
SCAN_LAYERS = Field("model.scan_layers", bool)
