"""`mlbench plan`'s parts: RCPs as the official checker reads them, the time-to-train
distribution, and the search on a synthetic time model (no compile)."""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from mlbench import rules
from mlbench.pod import odds, plan, rcp, timemodel, uncertainty


def _rounds() -> list[tuple[str, str, Path]]:
  """(round, benchmark, file) of every distinct training RCP file the installed checker
  reads (a file a later round copied unchanged is checked once)."""
  from mlperf_logging.rcp_checker import rcp_checker

  root = Path(str(resources.files("mlperf_logging").joinpath("rcp_checker")))
  out = {}
  for d in sorted(root.glob("training_*")):
    rnd = d.name.removeprefix("training_")
    for f in sorted(d.glob("rcps_*.json")):
      bench = f.stem.removeprefix("rcps_")
      if bench in rcp_checker.submission_runs["training"]:
        out[(bench, f.read_text())] = (rnd, bench, f)
  return sorted(out.values())


@pytest.mark.parametrize("rnd,bench,path", _rounds(), ids=lambda x: str(x)[-30:])
def test_rcp_interpolation_equals_the_official_checkers_on_its_own_tables(rnd, bench, path):
  """Means, spreads, pruning and the value at every batch between, below and above the
  references, against mlperf_logging.rcp_checker's own code on the same file."""
  from mlperf_logging.rcp_checker import rcp_checker

  checker = rcp_checker.RCP_Checker("training", rnd, bench, False)
  mine = rcp.from_json(bench, json.loads(path.read_text()), rnd, rules.Unit.EPOCHS)
  theirs = sorted(checker.rcp_data.values(), key=lambda r: r["BS"])
  assert [r.batch for r in mine.references] == [r["BS"] for r in theirs]
  for m, t in zip(mine.references, theirs):
    assert m.mean == pytest.approx(t["RCP Mean"], rel=1e-12)
    assert m.stdev == pytest.approx(t["RCP Stdev"], rel=1e-12)
  assert [r.batch for r in mine.pruned] == sorted(r["BS"] for r in checker.pruned_rcp_data.values())
  batches = sorted({b + d for b in mine.batches for d in (-1, 0, 1)} | {
      (a + b) // 2 for a, b in zip(mine.batches, mine.batches[1:])} | {1, 10 * mine.batches[-1]})
  for b in batches:
    got = rcp.at(mine, b)
    want = _checkers_view(checker, b)
    if want is None:
      assert got.how == rcp.ABOVE, b
      continue
    assert (got.mean, got.stdev) == pytest.approx(want, rel=1e-12), b


def _checkers_view(checker, bs):
  """(mean, stdev) the checker judges a submission at `bs` against (check_directory's
  branches, with the pruned references the package checker uses); None: no RCP."""
  found = checker._find_rcp(bs, "pruned_rcps")
  if found is not None:
    return found["RCP Mean"], found["RCP Stdev"]
  low = checker._find_top_min_rcp(bs, "pruned_rcps")
  high = checker._find_bottom_max_rcp(bs, "pruned_rcps")
  if low is not None and high is not None:
    _, r = checker._create_interp_rcp(bs, low, high)
    return r["RCP Mean"], r["RCP Stdev"]
  if high is not None:
    r = checker._find_min_rcp("pruned_rcps")
    return r["RCP Mean"], r["RCP Stdev"]
  return None


def test_the_distribution_median_and_band_from_a_known_spread():
  """A run's time as a fine step function of its draw: median at the mean, the band at
  the mean +- 1.2816 spreads; the score as an independent simulation of olympic means
  scaled as the RCP checker scales them."""
  grid = np.arange(1, 4001) * 0.01  # evaluations every 0.01 epochs up to 40
  stops = odds.Stops(values=tuple(grid), times_s=tuple(100.0 + 5.0 * grid))
  look = odds.outlook(stops, mean=30.0, stdev=2.0, runs=5)
  assert look.median_s == pytest.approx(100 + 5 * 30.0, abs=0.05)
  assert look.p10_s == pytest.approx(100 + 5 * (30 - 1.2815515655 * 2), abs=0.05)
  assert look.p90_s == pytest.approx(100 + 5 * (30 + 1.2815515655 * 2), abs=0.05)
  draws = np.ceil(np.random.default_rng(7).normal(30.0, 2.0, (200_000, 5)) / 0.01) * 0.01
  kept = np.sort(draws, axis=1)[:, 1:4].mean(axis=1)
  want = ((100 + 5 * kept) * np.maximum(1.0, 30.0 / kept)).mean()
  assert look.score_s == pytest.approx(want, rel=2e-3)
  assert look.score_s > look.median_s and look.scaling > 1 and look.p_no_result == 0
  exact = odds.outlook(stops, mean=30.0, stdev=0.0, runs=5)
  assert exact.score_s == exact.median_s == exact.p90_s == pytest.approx(250.0)
  # A draw past the last evaluation does not converge: two of five is no result.
  short = odds.Stops(values=(10.0, 20.0), times_s=(1.0, 2.0))
  assert odds.outlook(short, 20.0, 5.0, runs=5).p_no_result > 0.5


# A synthetic plan: 1,000 training examples, an evaluation every epoch, a per-device
# train step of 1 TFLOP per example at the chip's peak plus 10 ms of fixed work, nothing
# else (no HBM, collectives, evaluation FLOPs or warm-up time).
EXAMPLES, FLOPS = 1000, 1e12
CONSTANTS = timemodel.Constants(eta=1.0, hbm=1.0, fixed_flops=275e12 * 0.01, warmup_s=0.0,
                                eval_overhead_s=0.0, kappa=0.0)
TABLE = rcp.from_json("resnet", {
    "a": {"BS": 64, "Epochs to converge": [10, 10, 10]},
    "b": {"BS": 256, "Epochs to converge": [14, 14, 14]}}, "synthetic", rules.Unit.EPOCHS)


def _points(batch: int) -> list[tuple[int, float]]:
  return [(math.ceil(k * EXAMPLES / batch), float(k)) for k in range(1, 31)]


def _costs(calls: list, need_from: int | None = None):
  def cost(proxy: str, per_device: int) -> plan.Costs:
    calls.append((proxy, per_device))
    if need_from is not None and per_device >= need_from:
      return plan.Costs(None, None, need_bytes=40 * 2**30)
    return plan.Costs(train=timemodel.StepCost(FLOPS * per_device, 0.0),
                      eval=timemodel.StepCost(0.0, 0.0), peak_bytes=2**30,
                      model_flops_per_example=FLOPS)
  return cost


def _plan(objective=plan.Objective.TIME, batches=(64, 256), cost=None, names=("v4-8", "v4-16"),
          spread=None):
  return plan.evaluate([plan.target(n) for n in names], batches, TABLE,
                       cost_of=cost or _costs([]), points_of=_points, workload="synthetic",
                       eval_examples=1, runs=5, objective=objective,
                       constants=lambda platform: CONSTANTS, spread=spread)


def test_a_plan_on_a_synthetic_time_model_ranks_candidates_as_computed_by_hand():
  # Steps to converge: 10 epochs of batch 64 = ceil(156.25) = 157, 14 of 256 = 55; a step
  # is the per-device batch x 1 TFLOP at 275 TFLOP/s plus 10 ms; an evaluation a batch
  # (of no FLOPs) with its 10 ms of fixed work, one an epoch.
  def by_hand(chips, batch):
    epochs = 10 if batch == 64 else 14
    steps = math.ceil(epochs * EXAMPLES / batch)
    return steps * (batch / chips * FLOPS / 275e12 + 0.01) + epochs * 0.01

  want = {(c, b): by_hand(c, b) for c in (4, 8) for b in (64, 256)}
  result = _plan()
  got = {(c.target.chips, c.batch): c for c in result.candidates}
  # The one other term: each evaluation's sums all-reduced over the chips, a few hops of
  # 1 us each (4 to 6 us an evaluation).
  for key, seconds in want.items():
    assert got[key].outlook.median_s == pytest.approx(seconds, abs=1e-4)
    assert got[key].outlook.score_s == pytest.approx(got[key].outlook.median_s)  # no spread
    assert got[key].chip_hours == pytest.approx(seconds * key[0] / 3600, rel=1e-4)
  assert [(c.target.chips, c.batch) for c in result.candidates] == sorted(want, key=want.get)
  assert [c.rank for c in result.candidates] == [1, 2, 3, 4]
  cheap = _plan(plan.Objective.CHIP_HOURS)
  assert [(c.target.chips, c.batch) for c in cheap.candidates] == sorted(
      want, key=lambda k: want[k] * k[0])
  # The fastest (8 chips, 64) and the cheapest (4 chips, 64); the others are beaten on both.
  assert {(c.target.chips, c.batch) for c in result.candidates if c.pareto} == {(8, 64), (4, 64)}


def test_one_compile_per_per_device_shape():
  """v4-8 (4 chips) and v4-16 (8) at 64 and 128: per-device 16, 8, 32 and 16 again; all
  are compiled for v4-8, the 16 once. A v5p slice is another generation: its own."""
  calls = []
  result = _plan(batches=(64, 128), cost=_costs(calls), names=("v4-8", "v4-16", "v5p-16"))
  assert sorted(calls) == [("v4-8", 8), ("v4-8", 16), ("v4-8", 32), ("v5p-8", 8), ("v5p-8", 16)]
  assert len(result.candidates) == 6


def test_a_candidate_that_does_not_fit_is_marked_with_its_fix():
  """Per-device 64 needs 40 GiB of a v4 chip's 32: not fitting, with a per-device batch that
  would (64 x 32 / 40 x 0.8 = 40); per-device 128 is not compiled at all."""
  calls = []
  result = _plan(batches=(256, 512), cost=_costs(calls, need_from=64), names=("v4-8", "v4-32"))
  assert sorted(calls) == [("v4-8", 16), ("v4-8", 32), ("v4-8", 64)]
  by = {(c.target.name, c.batch): c for c in result.candidates}
  bad = by[("v4-8", 256)]
  assert not bad.fits and bad.rank is None and bad.outlook is None
  assert "does not fit (40.0 GiB per device of 32)" in bad.fix
  assert "--weight-update-sharding" in bad.fix
  assert "per-device batch of 40 (--batches 160)" in bad.fix
  skipped = by[("v4-8", 512)]
  assert not skipped.fits and skipped.costs.origin == "not compiled"
  assert "per-device batch of 64 (--batches 256)" in skipped.fix
  assert all(c.fits and c.rank for k, c in by.items() if k[0] == "v4-32")


def test_plan_json_follows_its_schema():
  import jsonschema

  schema = json.loads(resources.files("mlbench").joinpath("pod", "plan.schema.json").read_text())
  doc = plan.to_json(_plan(cost=_costs([], need_from=64), batches=(64, 256, 512)))
  jsonschema.validate(doc, schema)
  assert {c["fits"] for c in doc["candidates"]} == {True, False}
  doc["candidates"][0].pop("time_s")  # a row without its time must not pass
  with pytest.raises(jsonschema.ValidationError):
    jsonschema.validate(doc, schema)


def test_slice_names_and_gpus():
  t = plan.target("v5p-256")
  assert (t.chips, t.devices, t.proxy, t.gpu) == (128, 128, "v5p-8", False)
  assert plan.target("v3-32").devices == 32 and plan.target("v3-32").proxy == "v3-8"
  g = plan.target("h100-64")
  assert g.gpu and g.chips == 64 and g.accelerator.platform == "gpu" and g.proxy == "v4-8"
  from mlbench.errors import UserError

  with pytest.raises(UserError, match="nodes of 8"):
    plan.target("h100-12")
  with pytest.raises(UserError, match="unknown TPU slice"):
    plan.target("v5p-7")


def test_the_time_models_spread_widens_the_band_and_raises_the_score():
  """Convergence without spread (one stop at 250 s) and the time model off by a
  log-normal factor of log-spread 0.3: the band is 250 x exp(-+1.2816 x 0.3), the median
  stays 250, the expected score is 250 x exp(0.3^2 / 2)."""
  stops = odds.Stops(values=(30.0,), times_s=(250.0,))
  look = odds.outlook(stops, mean=30.0, stdev=0.0, runs=5, model_sigma=0.3)
  assert look.median_s == 250.0
  assert look.p10_s == pytest.approx(250 * math.exp(-odds.Z90 * 0.3), rel=0.01)
  assert look.p90_s == pytest.approx(250 * math.exp(odds.Z90 * 0.3), rel=0.01)
  assert look.score_s == pytest.approx(250 * math.exp(0.3**2 / 2), rel=0.01)


SURE = uncertainty.Uncertainty(
    "tpu", loo=uncertainty.Spread(1.2, 1.5, 24),
    never_fitted=uncertainty.Spread(1.35, 2.0, 18, bias=0.8, slower=17, what="v0.6"),
    accelerators=("tpu_v4",), workloads=("synthetic",))


def test_an_uncalibrated_generation_is_marked_extrapolated_with_a_wider_band():
  """v4 has calibration runs: its band is the wider spread's (the never-fitted runs' x/÷
  1.35); v5p has none: extrapolated, why, and x/÷ exp(sqrt(ln 1.35^2 + ln 2^2)) (the
  largest miss on a run the fit did not see, added in quadrature); in the plan's JSON too."""
  result = _plan(names=("v4-16", "v5p-16"), batches=(64,),
                 spread=lambda platform, acc, wl: SURE.describe(acc, wl))
  by = {c.target.accelerator.name: c for c in result.candidates}
  v4, v5p = by["tpu_v4"], by["tpu_v5p"]
  assert v4.extrapolated == () and v4.spread["band_factor"] == pytest.approx(1.35)
  assert len(v5p.extrapolated) == 1 and "tpu_v5p" in v5p.extrapolated[0]
  wide = math.exp(math.sqrt(math.log(1.35) ** 2 + math.log(2.0) ** 2))
  assert v5p.spread["band_factor"] == pytest.approx(wide, rel=1e-3)
  band = lambda c: c.outlook.p90_s / c.outlook.p10_s
  assert band(v5p) > band(v4) > 1.5  # the convergence band alone is one evaluation wide here
  assert "no calibration run of bert" in SURE.describe("tpu_v4", "bert")["extrapolated"][0]
  doc = plan.to_json(result)
  rows = {c["accelerator"]: c for c in doc["candidates"]}
  assert rows["tpu_v5p"]["extrapolated"] and rows["tpu_v4"]["extrapolated"] == []
  assert rows["tpu_v5p"]["band_factor"] > rows["tpu_v4"]["band_factor"]


def test_plan_json_carries_both_spreads():
  import jsonschema

  schema = json.loads(resources.files("mlbench").joinpath("pod", "plan.schema.json").read_text())
  doc = plan.to_json(_plan(spread=lambda platform, acc, wl: SURE.describe(acc, wl)))
  jsonschema.validate(doc, schema)
  tpu = doc["uncertainty"]["tpu"]
  assert tpu["leave_one_out"]["factor"] == 1.2 and tpu["leave_one_out"]["runs"] == 24
  assert tpu["never_fitted"]["factor"] == 1.35 and tpu["never_fitted"]["slower_than_predicted"] == 17
  assert tpu["wider_factor"] == pytest.approx(1.35)
  assert "17 of 18 slower than predicted" in tpu["summary"]
