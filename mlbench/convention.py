"""A `Workload` from a workload package laid out by convention, overriding what differs.

A workload package keeps its parts in modules of fixed names (as the flax examples and
big_vision do):

    config.py          mini(), full(): its configs (nothing heavy imported)
    train.py           schedule, init, loss, optimizer, eval_step, compute, hparams,
                       partition_rules, flops_per_example
    input_pipeline.py  files, decode, synthetic_batch

`from_package` points the `Workload`'s callables there, each imported on first use
(`lazy`), and the package names only what differs: members that live in
another module (`elsewhere={"prepare": "scenes"}`), optional members it has where the
convention puts them (`also=("layer_stack",)`), conventional members it lacks
(`without=("decode",)`) and the plain fields (`spatial_inputs`, `start`, ...). Every name is
checked against the lists below, so a typo fails with the valid ones. This is a helper a
plugin calls in its `__init__.py`, nothing more: a third-party plugin may build its
`Workload` by hand and registers, like the built-in ones, through the `mlbench.workloads`
entry points.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from mlbench.errors import choices
from mlbench.workload import EvalSpec, InputSpec, Workload

TRAIN, INPUT, CONFIG = "train", "input_pipeline", "config"

CONVENTIONAL = {
    "schedule": TRAIN, "init": TRAIN, "loss": TRAIN, "optimizer": TRAIN, "hparams": TRAIN,
    "eval_step": TRAIN, "compute": TRAIN, "partition_rules": TRAIN,
    "flops_per_example": TRAIN, "files": INPUT, "decode": INPUT, "synthetic_batch": INPUT,
}
"""Members every package is expected to define, and the module that holds each."""

OPTIONAL = {"layer_stack": TRAIN, "host": TRAIN, "prepare": INPUT, "bind": INPUT,
            "keep": INPUT, "examples": INPUT, "verify": INPUT, "pack": INPUT}
"""Members a package may define (see `Workload`, `InputSpec`, `EvalSpec`), and where."""

CONFIGS = ("mini", "full")
"""The functions of `config.py` that build the configs of those names."""

_INPUT_FIELDS = ("files", "decode", "prepare", "bind", "examples", "keep", "verify", "pack")
_EVAL_FIELDS = {"eval_step": "step", "compute": "compute", "host": "host"}


def lazy(target: str) -> Callable[..., Any]:
  """A callable that imports `"package.module:function"` on first call (`.resolve()` does
  it now; `.target` names it). A workload's `__init__` imports no JAX, Flax or TensorFlow:
  `mlbench list` stays fast."""
  module, _, attr = target.partition(":")

  @functools.cache
  def resolve() -> Callable[..., Any]:
    return getattr(importlib.import_module(module), attr)

  def call(*args: Any, **kwargs: Any) -> Any:
    return resolve()(*args, **kwargs)

  call.__name__ = call.__qualname__ = attr
  call.__doc__ = f"Calls {target} (imported on first use)."
  call.target, call.resolve = target, resolve
  return call


def _places(elsewhere: Mapping[str, str], also: Iterable[str],
            without: Iterable[str]) -> dict[str, str]:
  """member -> module, for every member the package has."""
  for what, names, valid in (("elsewhere", elsewhere, {**CONVENTIONAL, **OPTIONAL}),
                             ("also", also, OPTIONAL), ("without", without, CONVENTIONAL)):
    unknown = set(names) - set(valid)
    if unknown:
      raise TypeError(f"from_package({what}=...): no member {choices(unknown)}; "
                      f"choose from: {choices(valid)}")
  places = {m: module for m, module in CONVENTIONAL.items() if m not in set(without)}
  places.update({m: OPTIONAL[m] for m in also})
  places.update(elsewhere)
  return places


def from_package(package: str, *, benchmark: str, quality_metric: str,
                 elsewhere: Mapping[str, str] | None = None, also: Iterable[str] = (),
                 without: Iterable[str] = (), **fields: Any) -> Workload:
  """The `Workload` of the package `package` ("workloads.resnet50"), named after its last
  part unless `fields` gives a `name`.

  Args:
    package: the dotted name of the workload package (its `__name__`).
    benchmark, quality_metric: see `Workload`.
    elsewhere: member -> the module that defines it, where that is not the convention's:
      a module of the package ("scenes"), or any module by its dotted name
      ("workloads.common.classify").
    also: optional members (`OPTIONAL`) the package defines where the convention puts them.
    without: conventional members the package does not define (`decode` for data that is
      read as `examples`; `partition_rules`, `flops_per_example` for a plugin without them).
    **fields: the `Workload`'s other fields (`spatial_inputs`, `rulesets`, `start`, ...;
      `configs` to replace the convention's).

  Returns:
    The workload; nothing of the package but `config.py` is imported until a callable runs.
  """
  places = _places(elsewhere or {}, also, without)
  member = {m: lazy(f"{module if '.' in module else f'{package}.{module}'}:{m}")
            for m, module in places.items()}
  if "configs" not in fields:
    config = importlib.import_module(f"{package}.{CONFIG}")
    fields["configs"] = {name: getattr(config, name) for name in CONFIGS}
  eval_spec = EvalSpec(**{f: member[m] for m, f in _EVAL_FIELDS.items() if m in member})
  input_spec = InputSpec(**{f: member[f] for f in _INPUT_FIELDS if f in member})
  plain = {m: member[m] for m in ("schedule", "init", "loss", "optimizer", "hparams",
                                  "synthetic_batch", "partition_rules", "flops_per_example",
                                  "layer_stack") if m in member}
  return Workload(name=fields.pop("name", package.rpartition(".")[2]), benchmark=benchmark,
                  quality_metric=quality_metric, input=input_spec, eval=eval_spec,
                  **plain, **fields)
