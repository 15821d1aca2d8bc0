"""MLPerf's reference convergence points (RCPs), read as the official RCP checker reads them.

An RCP file (`mlperf_logging/rcp_checker/training_<round>/rcps_<benchmark>.json`)
holds, per global batch size, the epochs (ResNet, SSD) or samples (BERT) the
reference runs needed to reach the target. The checker
(`mlperf_logging.rcp_checker.rcp_checker.RCP_Checker`, mlperf-logging 4.1.68) turns
each into a mean and a spread, prunes the points that converge slower than the
line through their neighbours, and judges a submission's batch against the
pruned points: the point at that batch, else a straight line between the
nearest smaller and larger ones; below the smallest, the smallest's point (the
submission must converge no faster); above the largest, none ("Missing RCP").
This module does the same, step for step, so a plan's steps to converge are the
checker's:

- mean: the olympic mean (the fastest and the slowest run dropped; unet3d four
  each) of the sorted list (`compute_rcp_stats`);
- spread: `np.std` of all runs (the population standard deviation);
- pruning (`_prune_rcps`): the points at batches below the fastest-converging
  one go; then, left to right, a point slower than the interpolation of its
  neighbours goes and the walk steps back one;
- interpolation (`_create_interp_rcp`): `np.interp` of mean and spread.

The data files are read from the installed mlperf-logging package (no import of
its code: only `mlbench.mllog` imports mlperf_logging), or from a custom file of
the same format (the checker's `--custom_rcps`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

from mlbench import rules
from mlbench.errors import UserError

FOUND, INTERPOLATED, BELOW, ABOVE = ("RCP found", "RCP Interpolation",
                                     "below the smallest RCP batch", "above the largest RCP batch")


@dataclasses.dataclass(frozen=True)
class Reference:
  """One batch size's reference runs, as the checker summarises them."""

  batch: int
  mean: float    # olympic mean
  stdev: float   # population standard deviation of all runs
  runs: int


@dataclasses.dataclass(frozen=True)
class Table:
  """The RCPs of one benchmark in one round (or a custom file)."""

  benchmark: str
  source: str                      # 'MLPerf 4.0.0' or the custom file's path
  unit: rules.Unit
  references: tuple[Reference, ...]  # every batch, smallest first
  pruned: tuple[Reference, ...]      # what the package checker judges against

  @property
  def batches(self) -> tuple[int, ...]:
    return tuple(r.batch for r in self.references)


@dataclasses.dataclass(frozen=True)
class Convergence:
  """Epochs or samples to converge at one batch: the checker's mean and spread there."""

  batch: int
  mean: float
  stdev: float
  unit: rules.Unit
  how: str        # FOUND, INTERPOLATED, BELOW or ABOVE
  source: str

  @property
  def covered(self) -> bool:
    """Whether the checker has a reference for this batch (found or interpolated)."""
    return self.how in (FOUND, INTERPOLATED)

  def describe(self) -> str:
    what = {FOUND: "the reference at this batch", INTERPOLATED: "interpolated as the RCP "
            "checker does", BELOW: "the smallest reference batch's (the checker asks no faster)",
            ABOVE: "the largest reference batch's: the checker has none above it, a submission "
            "must bring its own RCPs"}[self.how]
    return (f"{self.source} RCPs: {self.mean:,.4g} ± {self.stdev:,.3g} {self.unit.value} at "
            f"batch {self.batch:,} ({what})")


def olympic_mean(values: list[float], drop: int = 1) -> float:
  """The mean of the sorted values less `drop` at each end (MLPerf's olympic mean)."""
  kept = sorted(values)[drop:len(values) - drop]
  return sum(kept) / len(kept)


def _reference(benchmark: str, raw: dict[str, Any]) -> Reference:
  key = "samples to converge" if benchmark in ("llama2_70b_lora", "flux1") else \
      "Epochs to converge"
  runs = [float(x) for x in raw[key]]
  drop = 4 if benchmark == "unet3d" else 1
  mean = sum(runs) / len(runs)
  stdev = math.sqrt(sum((x - mean) ** 2 for x in runs) / len(runs))
  return Reference(batch=int(raw["BS"]), mean=olympic_mean(runs, drop), stdev=stdev,
                   runs=len(runs))


def _line(b: int, low: Reference, high: Reference) -> tuple[float, float]:
  """(mean, stdev) at batch b on the line between two references (np.interp)."""
  f = (b - low.batch) / (high.batch - low.batch)
  return (low.mean + f * (high.mean - low.mean), low.stdev + f * (high.stdev - low.stdev))


def prune(references: tuple[Reference, ...]) -> tuple[Reference, ...]:
  """The references the package checker keeps (`RCP_Checker._prune_rcps`)."""
  fastest = min(references, key=lambda r: r.mean)  # the first of equal means, as min() does
  kept = [r for r in references if r.batch >= fastest.batch]
  i = 1
  while i < len(kept) - 1:
    if kept[i].mean > _line(kept[i].batch, kept[i - 1], kept[i + 1])[0]:
      del kept[i]
      i -= 1
    i += 1
  return tuple(kept)


def _file(benchmark: str, ruleset: str) -> tuple[str, Any]:
  """(round, file) of the first round at or after `ruleset` with RCPs for the benchmark."""
  root = resources.files("mlperf_logging").joinpath("rcp_checker")
  want = tuple(int(x) for x in ruleset.split("."))
  found = []
  for d in root.iterdir():
    name = d.name
    if name.startswith("training_") and d.joinpath(f"rcps_{benchmark}.json").is_file():
      rnd = name.removeprefix("training_")
      version = tuple(int(x) for x in rnd.split("."))
      if version >= want:
        found.append((version, rnd, d.joinpath(f"rcps_{benchmark}.json")))
  if not found:
    raise UserError(f"mlperf-logging has no reference convergence points for {benchmark} from "
                    f"round {ruleset} on; give a file of them with --rcps FILE")
  _, rnd, path = min(found)
  return rnd, path


def load(rule: rules.Rule, path: Path | None = None) -> Table:
  """The RCPs for a rule's benchmark: from `path` (the checker's JSON format) or the
  first round at or after the rule's that has them."""
  benchmark = rule.checker_benchmark
  if path is not None:
    try:
      raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
      raise UserError(f"--rcps {path}: cannot read it as an RCP JSON file ({e})") from None
    source = str(path)
  elif not rule.official:
    raise UserError(f"the {rule.ruleset} {rule.benchmark} rules have no reference convergence "
                    "points (they are no MLPerf round's); give a file of them with --rcps FILE")
  else:
    rnd, found = _file(benchmark, rule.ruleset)
    raw, source = json.loads(found.read_text()), f"MLPerf {rnd}"
  return from_json(benchmark, raw, source, rule.convergence_unit)


def from_json(benchmark: str, raw: dict[str, Any], source: str, unit: rules.Unit) -> Table:
  """A table from the RCP checker's JSON format ({name: {BS, 'Epochs to converge'}})."""
  try:
    refs = tuple(sorted((_reference(benchmark, v) for v in raw.values()), key=lambda r: r.batch))
  except (KeyError, TypeError, ValueError, ZeroDivisionError, AttributeError) as e:
    raise UserError(f"{source}: not in the RCP format ({{name: {{BS, 'Epochs to converge': "
                    f"[...]}}}}): {e!r}") from None
  if not refs:
    raise UserError(f"{source}: no reference convergence points in it")
  return Table(benchmark=benchmark, source=source, unit=unit, references=refs,
               pruned=prune(refs))


def at(table: Table, batch: int) -> Convergence:
  """The checker's mean and spread for a submission at `batch` (pruned references, as
  the package checker runs it)."""
  refs = table.pruned
  exact = next((r for r in refs if r.batch == batch), None)
  below = [r for r in refs if r.batch < batch]
  above = [r for r in refs if r.batch > batch]
  if exact is not None:
    mean, stdev, how = exact.mean, exact.stdev, FOUND
  elif below and above:
    (mean, stdev), how = _line(batch, below[-1], above[0]), INTERPOLATED
  elif above:
    mean, stdev, how = refs[0].mean, refs[0].stdev, BELOW
  else:
    mean, stdev, how = refs[-1].mean, refs[-1].stdev, ABOVE
  return Convergence(batch=batch, mean=mean, stdev=stdev, unit=table.unit, how=how,
                     source=table.source)
