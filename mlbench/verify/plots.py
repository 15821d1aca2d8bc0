"""Convergence plots: the quality metric against minutes since run_start.

One panel per benchmark and quality target (a benchmark key that changed its
model or bar across rounds gets a panel per round), one line per run (a colour
per submission and system; dotted if it did not converge), the target as a
dashed line. Runs far slower than the panel's median are left off the x range
and counted in the title. matplotlib draws them, off-screen.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def convergence(entries: list[Any], path: Path) -> Path:
  """Writes a PNG of every entry's evaluation curves to `path`."""
  import matplotlib

  matplotlib.use("Agg")  # No display; never opens a window.
  import matplotlib.pyplot as plt

  panels = sorted({(e.bench.benchmark, e.target) for e in entries}, key=lambda p: (p[0], p[1] or 0))
  cols = min(3, len(panels)) or 1
  nrows = math.ceil(len(panels) / cols) or 1
  fig, axes = plt.subplots(nrows, cols, figsize=(5.5 * cols, 4 * nrows), squeeze=False)
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  series = sorted({(str(e.source), e.bench.system) for e in entries})
  for ax, (bench, target) in zip(axes.flat, panels):
    chosen = [e for e in entries if e.bench.benchmark == bench and e.target == target]
    _panel(ax, chosen, bench, series, colors)
  for ax in list(axes.flat)[len(panels):]:
    ax.axis("off")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def _panel(ax: Any, entries: list[Any], bench: str, series: list, colors: list) -> None:
  for e in entries:
    color = colors[series.index((str(e.source), e.bench.system)) % len(colors)]
    for i, run in enumerate(e.runs):
      if not run.evals:
        continue
      xs, ys = zip(*run.evals)
      ax.plot(xs, ys, color=color, alpha=0.8, linewidth=1.2, marker=".", markersize=3,
              linestyle="-" if run.converged else ":",
              label=f"{e.bench.system} ({Path(e.source).name})" if i == 0 else None)
  targets = {e.target for e in entries if e.target is not None}
  for t in targets:
    ax.axhline(t, color="black", linestyle="--", linewidth=1, label=f"target {t:g}")
  kept, outliers = [], []
  for e in entries:  # A run 5x slower than its own system's median (e.g. a log edited
    ends = sorted(r.evals[-1][0] for r in e.runs if r.evals)  # to be dropped) would
    for x in ends:                                             # squash every other line.
      (outliers if x > 5 * ends[len(ends) // 2] else kept).append(x)
  if outliers and kept:
    ax.set_xlim(left=0, right=1.1 * max(kept))
  rounds = ", ".join(sorted({e.ruleset for e in entries}))
  ax.set_title(f"{bench} ({rounds})" + (f"; {len(outliers)} run(s) beyond "
                                        f"{ax.get_xlim()[1]:.0f} min not shown" if outliers else ""))
  ax.set_xlabel("minutes since run_start")
  ax.set_ylabel("eval_accuracy")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, loc="lower right")
