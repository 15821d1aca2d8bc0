"""The workload plugin contract.

A workload is a frozen `Workload` value: a name, its MLPerf benchmark key, its
configs and a handful of pure callables. Nothing is inherited. The harness owns
the loop, `jax.jit`, sharding, the clock, input-pipeline tuning and MLPerf
logging; a workload owns its model, its data format, its loss and its metric.

Every callable takes the workload's own config (a frozen dataclass built by one
of `Workload.configs`) as its first argument, so a workload never sees a knob it
does not own, and the harness never reads a workload's config fields directly:
what it needs comes back through `Workload.schedule`.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

Config = Any  # a workload's own frozen config dataclass
Params = Any  # a pytree of trainable arrays
State = Any  # a pytree of non-trainable model state (batch-norm statistics), or {}
Array = Any  # a jax.Array (inside jitted code) or numpy array
Batch = Mapping[str, Any]  # a dict of arrays, each with the batch as its leading axis


@dataclasses.dataclass(frozen=True)
class WithMetadata:
  """A hyperparameter value logged with metadata on its line (the transformer's
  `max_sequence_length` names its `method`: truncate or discard)."""

  value: bool | int | float | str | list
  metadata: Mapping[str, Any]


HParam = bool | int | float | str | list | WithMetadata
"""An MLPerf hyperparameter value as it is logged."""


def unpack(value: HParam) -> tuple[Any, dict[str, Any]]:
  """(value, metadata) of a hyperparameter; metadata is {} for a plain value."""
  if isinstance(value, WithMetadata):
    return value.value, dict(value.metadata)
  return value, {}


class Split(enum.Enum):
  """Which part of a dataset."""
  TRAIN = "train"
  EVAL = "eval"


@dataclasses.dataclass(frozen=True)
class Packing:
  """Up to `max_per_row` examples a training row, rows sized at `factor` a row (BERT's)."""
  factor: float
  max_per_row: int


@dataclasses.dataclass(frozen=True)
class Schedule:
  """Batch sizes and the training budget of one config.

  Attributes:
    global_batch_size: examples per training step over all devices and hosts.
    eval_batch_size: examples per evaluation step over all devices and hosts.
    train_examples: examples in one epoch of the training set (`train_samples`).
    eval_examples: examples in the evaluation set (`eval_samples`), each evaluated
      exactly once per evaluation.
    max_train_samples: the budget; a run short of its target by then is `aborted`.
    gradient_accumulation_steps: microbatches of each step's global batch, run in
      turn; the optimizer applies their mean gradient once.
    eval_offset: every evaluation this much earlier than the rules' cadence puts
      it, in the rules' evaluation unit, up to their `max_offset` (the ResNet
      reference evaluates at epochs 2, 6, 10, ... with a cadence of 4).
    epoch_steps: whole steps in an epoch as the reference counts them (ResNet
      drops the remainder batch: 1,281,167 // 4,096 = 312), so evaluations fall
      on multiples of it; 0: `train_examples / global_batch_size`, rounded up.
  """

  global_batch_size: int
  eval_batch_size: int
  train_examples: int
  eval_examples: int
  max_train_samples: int
  gradient_accumulation_steps: int = 1
  eval_offset: float = 0.0
  epoch_steps: int = 0
  packing: Packing | None = None  # several examples a training row (see Packing)
  train_rows: int = 0  # rows a training step, as the harness resolved them (0: the batch)

  def rows(self) -> int:
    return self.train_rows or self.global_batch_size

  @property
  def steps_per_epoch(self) -> float:
    return self.train_examples / self.global_batch_size

  @property
  def max_steps(self) -> int:
    return -(-self.max_train_samples // self.global_batch_size)


@dataclasses.dataclass(frozen=True)
class StepContext:
  """Static facts about the parallel layout a step runs under; from the harness.

  Attributes:
    mesh: the `jax.sharding.Mesh` the step is compiled for (for explicit per-device
      programs with `jax.shard_map`, as the MoE dispatch).
    bn_groups: batch-norm statistics are computed over this many equal groups of
      the global batch (1: over the whole global batch).
    microbatches: with a `stage` mesh axis, the GPipe microbatches each batch (of
      every gradient-accumulation step) splits into; `mlbench.train.layers.stack` runs them.
  """

  mesh: Any
  bn_groups: int = 1
  microbatches: int = 1


class LossFn(Protocol):
  """`loss(cfg, ctx, params, state, batch, rng) -> (loss, (new_state, metrics))`.

  Pure and traceable: the harness differentiates it with respect to `params`
  and jits the whole step. `metrics` is a dict of scalars (for example an MoE
  auxiliary loss or the fraction of dropped tokens) that the harness averages
  over the steps between evaluations and reports; it must not contain `loss`.
  """

  def __call__(self, cfg: Config, ctx: StepContext, params: Params, state: State,
               batch: Batch, rng: Array) -> tuple[Array, tuple[State, dict[str, Array]]]: ...


class EvalStepFn(Protocol):
  """`step(cfg, ctx, params, state, batch) -> outputs`, jitted by the harness.

  Returns a dict of per-example arrays (leading axis = batch). Evaluation
  batches carry an int32 `mask` (1: real example, 0: padding) added by the
  harness, which also drops the padded rows before `EvalSpec.host` sees them,
  so workloads never handle padding.
  """

  def __call__(self, cfg: Config, ctx: StepContext, params: Params, state: State,
               batch: Batch) -> dict[str, Array]: ...


@dataclasses.dataclass
class EvalPart:
  """What one evaluation batch (or the merge of many) contributes to a metric.

  Attributes:
    sums: arrays added across batches and hosts (hit counts, loss sums, BLEU
      n-gram statistics, ...).
    rows: arrays with a leading row axis, concatenated across batches and hosts
      (detections for COCO evaluation, ...).
    count: real (unpadded) examples seen; filled in by the harness.
  """

  sums: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
  rows: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
  count: int = 0


def sum_outputs(cfg: Config, outputs: dict[str, np.ndarray], batch: Batch) -> EvalPart:
  """The default `EvalSpec.host`: sum every per-example output over the batch."""
  del cfg, batch
  return EvalPart(sums={k: np.asarray(v, np.float64).sum(axis=0) for k, v in outputs.items()})


@dataclasses.dataclass(frozen=True)
class EvalSpec:
  """How a workload's quality metric is computed, in three stages.

  Attributes:
    step: the device part (see `EvalStepFn`), per batch.
    compute: the final reduction, `compute(cfg, merged_part) -> metrics`, run
      once per evaluation on every process with identical input. The result
      holds `Workload.quality_metric` in the units the rules use.
    host: the host part, `host(cfg, outputs, batch) -> EvalPart`, per batch, on
      this process's real rows only (numpy arrays).
  """

  step: EvalStepFn
  compute: Callable[[Config, EvalPart], dict[str, float]]
  host: Callable[[Config, dict[str, np.ndarray], Batch], EvalPart] = sum_outputs


DecodeFn = Callable[[Any, Any], dict[str, Any]]
"""`decode(serialized_record, seed) -> example`: TensorFlow ops, run inside tf.data.

`seed` is a shape-[2] int64 tensor that differs per example and per run; use it
with `tf.random.stateless_*` ops so augmentation is reproducible. An example is a
dict of tensors of fixed shape (one example, no batch axis).
"""


DataCheck = tuple[str, str, str, bool | None]
"""A row of `mlbench data verify`: (check, expected, found, ok); ok None is a note."""


class Examples(Protocol):
  """Random-access examples: `len(x)` and `x[i] -> {feature: array}` (one example, no
  batch axis), like a PyTorch map-style dataset. For data in formats of its own whose
  order the format defines (Megatron indexed datasets and their shuffled sample index)."""

  def __len__(self) -> int: ...

  def __getitem__(self, index: int) -> Mapping[str, np.ndarray]: ...


@dataclasses.dataclass(frozen=True)
class InputSpec:
  """How the harness reads a workload's data; the harness builds the pipeline.

  The harness shards files per host, interleaves, caches, shuffles, decodes in parallel,
  batches, pads the evaluation set, and prefetches to devices. The workload only names its
  files and decodes one record.

  A workload whose data is not TFRecords gives `examples` instead of `decode`: the
  harness then reads training examples in index order (step s takes examples
  [s * B, (s + 1) * B), host h its h-th slice of them, so the global batches are the
  same whatever the host count) and evaluation examples 0 .. eval_examples - 1,
  host h taking h, h + hosts, ..., padded and masked as for TFRecords.

  Attributes:
    files: `files(cfg, data_dir, split) -> paths` of the data files (TFRecord
      files, unless `examples` reads them). Raises `mlbench.errors.UserError`
      naming the expected layout if they are missing.
    decode: `decode(cfg, split) -> DecodeFn`, for TFRecords.
    prepare: `prepare(cfg, data_dir)` creates the dataset under `data_dir` if this config's data
      can be generated locally (the mini configs) and does nothing if it is already there; None
      if the data must be supplied. Runs before the benchmark, like MLPerf's `init_datasets.sh`.
    bind: `bind(cfg, data_dir) -> cfg` fills in config fields that name files beside the data
      (the Transformer's subword vocabulary, which its eval host part needs to turn token ids
      into text); runs after `prepare`. None: the config needs nothing from the data folder.
    examples: `examples(cfg, data_dir, split, seed) -> Examples`, for other
      formats; `seed` is the run's (training order may depend on it).
    keep: `keep(cfg, split) -> predicate`, a TensorFlow function of one
      serialized record returning a scalar bool; records it rejects are not
      part of the dataset (read past before shuffling and sharding, so the
      logged `train_samples`/`eval_samples` count only kept ones). SSD: the
      reference drops COCO images without annotations. None: keep every record.
    verify: `verify(cfg, folder, full) -> [DataCheck]`: what `mlbench data verify` checks
      of this format in a prepared folder beyond every dataset's files, sizes and schema
      (`full`: also the checks that read everything). None: nothing more.
    pack: `pack(cfg, examples, rows) -> packer` (`Schedule.packing`): `packer(chunks)` makes decoded
      examples (numpy chunks, shuffled) into endless batches of `rows` rows holding `examples`.
  """

  files: Callable[[Config, Path, Split], Sequence[str]]
  decode: Callable[[Config, Split], DecodeFn] | None = None
  prepare: Callable[[Config, Path], None] | None = None
  bind: Callable[[Config, Path], Config] | None = None
  examples: Callable[[Config, Path, Split, int], Examples] | None = None
  keep: Callable[[Config, Split], Callable[[Any], Any]] | None = None
  verify: Callable[[Config, Path, bool], Sequence[DataCheck]] | None = None
  pack: Callable[[Config, int, int], Callable[[Any], Any]] | None = None

  def __post_init__(self) -> None:
    if (self.decode is None) == (self.examples is None):
      raise TypeError("InputSpec needs exactly one of decode (TFRecords) and examples")


@dataclasses.dataclass(frozen=True)
class StartPoint:
  """Weights the MLPerf reference trains from: a closed run under official rules is
  refused without them, an open one logs that it starts from random weights."""

  key: str     # the config field holding their path (`--init-checkpoint` sets it)
  name: str    # what they are: "the phase-1 checkpoint model.ckpt-28252"
  source: str  # where they come from, for the message that asks for them


@dataclasses.dataclass(frozen=True)
class LayerStack:
  """`layers` repeated layers, parameters stacked on a leading axis under the parameter
  subtree `path` ("layers"); partition rules describe one layer, the harness adds the axis."""

  path: str
  layers: int


@dataclasses.dataclass(frozen=True)
class Workload:
  """A benchmark plugin. Register it under the `mlbench.workloads` entry point.

  Attributes:
    name: the CLI name (`mlbench run <name>`).
    benchmark: the MLPerf benchmark key (`resnet`, `bert`, ...); selects the
      rules and names the results folder.
    quality_metric: the key of `EvalSpec.compute`'s result that the rules'
      quality target applies to.
    configs: config name -> function returning a fresh config. `mini` trains to
      its target on a CPU in minutes; `full` is the MLPerf reference setup.
    schedule: batch sizes and training budget of a config.
    init: `init(cfg, rng) -> (params, state)`; pure, the harness jits it with
      sharded outputs so nothing is ever materialised unsharded.
    loss: see `LossFn`.
    optimizer: `optimizer(cfg, schedule) -> optax.GradientTransformation`.
    input: see `InputSpec`.
    eval: see `EvalSpec`.
    synthetic_batch: `synthetic_batch(cfg, split, batch_size, rng) -> Batch` of realistic random
      data with the exact keys, shapes and dtypes that `decode` produces (the harness adds
      `mask` to evaluation batches; packed training: `pack`'s rows). Used for tests and for
      compiling from shapes.
    hparams: `hparams(cfg, schedule, ctx) -> {mlperf_key: value}`: the workload's MLPerf
      hyperparameter keys (optimizer, schedule, model choices; `model_bn_span` from
      `ctx.bn_groups` for batch-norm models). The harness adds `global_batch_size`,
      `train_samples`, `eval_samples`, `gradient_accumulation_steps` and `seed`.
    partition_rules: `partition_rules(cfg) -> [(regex, logical PartitionSpec)]` on parameter
      paths (`layer_0/attention/query/kernel`); the harness maps the logical axes onto the mesh.
      Default: none, everything replicated.
    flops_per_example: analytic model FLOPs of one training example (forward and
      backward); None: no MFU is reported.
    layer_stack: `layer_stack(cfg) -> LayerStack | None`, the layers built by
      `mlbench.train.layers.stack`: what a `stage` mesh axis splits into pipeline stages.
    spatial_inputs: batch keys of images [B, H, W, C] that a `spatial` mesh axis
      splits by height (convolutional workloads); empty: no spatial partitioning.
    default_config: the config `mlbench run <name>` uses.
    rulesets: the official rulesets whose `benchmark` this workload implements, where
      the key named other models in other rounds (`ssd`: SSD-ResNet-34 up to 0.7.0);
      empty: every ruleset with rules for `benchmark`. `mini` is always allowed.
    start: the reference's starting point, if it has one (see `StartPoint`).
  """

  name: str
  benchmark: str
  quality_metric: str
  configs: Mapping[str, Callable[[], Config]]
  schedule: Callable[[Config], Schedule]
  init: Callable[[Config, Array], tuple[Params, State]]
  loss: LossFn
  optimizer: Callable[[Config, Schedule], Any]
  input: InputSpec
  eval: EvalSpec
  synthetic_batch: Callable[[Config, Split, int, np.random.Generator], Batch]
  hparams: Callable[[Config, Schedule, StepContext], Mapping[str, HParam]]
  partition_rules: Callable[[Config], Sequence[tuple[str, Any]]] = lambda cfg: ()
  flops_per_example: Callable[[Config], float] | None = None
  layer_stack: Callable[[Config], LayerStack | None] = lambda cfg: None
  spatial_inputs: tuple[str, ...] = ()
  default_config: str = "mini"
  rulesets: tuple[str, ...] = ()
  start: StartPoint | None = None

