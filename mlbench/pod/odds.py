"""The time to train as a distribution: what the spread of convergence makes of it.

A run stops at the first evaluation whose quality reaches the target. How far
it trains before that is drawn, run by run, from the reference convergence
points at its batch (`rcp`): normal, with the checker's mean and spread, in the
RCP's unit (epochs or samples). The time to train of a run that converges
between two evaluations is the predicted time to the later one (`Stops`), so a
run's time is a step function of its draw, non-decreasing: its quantiles are
the step function at the draw's quantiles (the median at the mean, the 10-90%
band at the mean ± 1.2816 spreads).

The MLPerf score of `runs` runs is the olympic mean of their times (the fastest
and slowest dropped; `result_summarizer`), times the RCP checker's
normalisation: when the olympic mean of the runs' epochs to converge is below
the RCP mean, the score is scaled by RCP mean / that mean (`scaling.json`,
`RCP_Checker._eval_submission_record`), so luck in convergence is not a faster
score. Its expectation has no closed form with that factor; it is estimated
from `trials` sets of runs drawn with a fixed seed (the same answer every time).
A run whose draw lies beyond the last evaluation of the training budget does
not converge; a set with more than one such run is no result (MLPerf accepts
one), counted in `p_no_result`.

The time model's own error (`model_sigma`, the log-spread `mlbench.pod.uncertainty`
gives) multiplies every time by a log-normal factor, one per set of runs (the model is
wrong about a system, not about one run of it): the band is then one run's time in
the simulated sets, the median stays the model's central estimate (the factor's median
is 1), and the expected score grows by the factor's mean, exp(sigma^2 / 2).
"""

from __future__ import annotations

import dataclasses
import math

Z90 = 1.2815515655446004  # the standard normal's 90th percentile
TRIALS = 20000


@dataclasses.dataclass(frozen=True)
class Stops:
  """Where a run can stop: at each evaluation, its value in the RCP's unit (epochs or
  samples, increasing) and the predicted time to train if it stops there."""

  values: tuple[float, ...]
  times_s: tuple[float, ...]

  def index(self, x: float) -> int:
    """The first evaluation at or past x (len(values): none, the run does not converge)."""
    import bisect

    return bisect.bisect_left(self.values, x)

  def time_s(self, x: float) -> float:
    i = self.index(x)
    return self.times_s[i] if i < len(self.times_s) else math.inf


@dataclasses.dataclass(frozen=True)
class Outlook:
  """A candidate's time to train: one run's median and 10-90% band, and the expected
  MLPerf score of `runs` runs."""

  median_s: float
  p10_s: float
  p90_s: float
  score_s: float          # expected olympic mean x RCP normalisation
  runs: int
  median_stop: int        # the evaluation the median run stops at
  scaling: float          # the expected RCP normalisation factor (>= 1)
  p_no_result: float      # chance that more than one of the runs does not converge


def olympic_drop(runs: int) -> int:
  """Runs dropped at each end: one where there are three or more (MLPerf's rule)."""
  return 1 if runs >= 3 else 0


def outlook(stops: Stops, mean: float, stdev: float, runs: int, *, trials: int = TRIALS,
            seed: int = 0, model_sigma: float = 0.0) -> Outlook:
  """The distribution of the time to train of runs converging after N(mean, stdev), the
  time model off by a log-normal factor of log-spread `model_sigma`."""
  import numpy as np

  if not stops.values:
    raise ValueError("no evaluation to stop at")
  z = (-Z90, 0.0, Z90)
  p10, median, p90 = (stops.time_s(mean + k * stdev) for k in z)
  values = np.asarray(stops.values + (math.inf,))
  times = np.asarray(stops.times_s + (math.inf,))
  rng = np.random.default_rng(seed)
  draws = rng.normal(mean, stdev, size=(trials, runs))
  idx = np.searchsorted(values[:-1], draws, side="left")
  factor = np.exp(model_sigma * rng.standard_normal((trials, 1))) if model_sigma else 1.0
  if model_sigma:  # one run's time in each set: its 10th and 90th percentiles
    one = np.sort((times[idx[:, :1]] * factor).ravel())
    p10, p90 = (float(one[min(len(one) - 1, int(q * len(one)))]) for q in (0.1, 0.9))
  t = np.sort(times[idx] * factor, axis=1)
  v = np.sort(values[idx], axis=1)
  drop = olympic_drop(runs)
  ok = np.isfinite(t[:, runs - 1 - drop])  # at most `drop` runs without a result
  if not ok.any():
    return Outlook(median_s=median, p10_s=p10, p90_s=p90, score_s=math.inf, runs=runs,
                   median_stop=stops.index(mean), scaling=1.0, p_no_result=1.0)
  kept_t = t[ok][:, drop:runs - drop].mean(axis=1)
  kept_v = v[ok][:, drop:runs - drop].mean(axis=1)
  scale = np.maximum(1.0, mean / kept_v)
  return Outlook(median_s=median, p10_s=p10, p90_s=p90, score_s=float((kept_t * scale).mean()),
                 runs=runs, median_stop=stops.index(mean), scaling=float(scale.mean()),
                 p_no_result=float(1.0 - ok.mean()))
