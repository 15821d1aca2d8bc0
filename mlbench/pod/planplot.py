"""The plan as a picture: time to train and chip-hours against chips.

Two panels sharing the x axis (chips, log scale): the predicted time to train
(the median run's, its 10-90% band shaded, the expected MLPerf score as a dot)
and the chip-hours of that score; one line per global batch, GPU candidates
hollow, extrapolated ones (no calibration run of that accelerator or workload)
dashed and labelled so. Candidates on the Pareto front (none both faster and
cheaper) are ringed. matplotlib draws it off-screen.
"""

from __future__ import annotations

from pathlib import Path

from mlbench.pod import plan as plan_lib


def plot(result: plan_lib.Result, path: Path, title: str) -> Path:
  """Writes the plan's PNG to `path`."""
  import matplotlib

  matplotlib.use("Agg")  # No display; never opens a window.
  import matplotlib.pyplot as plt
  import matplotlib.ticker

  ok = [c for c in result.candidates if c.outlook is not None and c.rank is not None]
  fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 6.5), sharex=True)
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  series = sorted({(c.target.gpu, c.target.accelerator.name, c.batch) for c in ok})
  for i, (gpu, acc, batch) in enumerate(series):
    cs = sorted((c for c in ok if (c.target.gpu, c.target.accelerator.name, c.batch)
                 == (gpu, acc, batch)), key=lambda c: c.target.chips)
    x = [c.target.chips for c in cs]
    color = colors[i % len(colors)]
    face = "none" if gpu else color
    extrapolated = any(c.extrapolated for c in cs)
    style = "--" if extrapolated else "-"
    label = f"{acc} batch {batch:,}" + (" (extrapolated)" if extrapolated else "")
    top.fill_between(x, [c.outlook.p10_s / 60 for c in cs], [c.outlook.p90_s / 60 for c in cs],
                     color=color, alpha=0.18, linewidth=0)
    top.plot(x, [c.outlook.median_s / 60 for c in cs], style, color=color, label=label)
    top.scatter(x, [c.outlook.score_s / 60 for c in cs], color=color, facecolors=face, s=18,
                zorder=3)
    bottom.plot(x, [c.chip_hours for c in cs], style + "o", color=color, markerfacecolor=face,
                markersize=4)
  front = [c for c in ok if c.pareto]
  top.scatter([c.target.chips for c in front], [c.outlook.score_s / 60 for c in front], s=110,
              facecolors="none", edgecolors="black", linewidths=1.2, zorder=4,
              label="Pareto front (time, chip-hours)")
  bottom.scatter([c.target.chips for c in front], [c.chip_hours for c in front], s=110,
                 facecolors="none", edgecolors="black", linewidths=1.2, zorder=4)
  for ax, values in ((top, [c.outlook.p90_s / 60 for c in ok]), (bottom,
                                                                  [c.chip_hours for c in ok])):
    if values and max(values) > 20 * min(values):  # a log scale where the range asks for it
      ax.set_yscale("log")
      ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
  bottom.set_xscale("log", base=2)
  chips = sorted({c.target.chips for c in ok})
  bottom.set_xticks(chips, [f"{n:,}" for n in chips])
  bottom.minorticks_off()
  top.set_ylabel("time to train (min)\nmedian, 10-90%, dot: score")
  bottom.set_ylabel(f"chip-hours\n(score of {result.runs} runs)")
  bottom.set_xlabel("chips")
  top.set_title(title, fontsize=10)
  top.legend(fontsize=7, loc="best")
  for ax in (top, bottom):
    ax.grid(True, which="both", alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=80)
  plt.close(fig)
  return path
