"""What a person watches during a run: a rich progress line on stderr.

On a terminal: a live bar over the training budget with samples/s, epoch, the
last evaluation and elapsed time. Elsewhere (CI logs, pipes): one plain line per
evaluation. Nothing here goes to stdout, which carries machine output only.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn


class RunProgress:
  """Progress of one run; use as a context manager. Silent when `enabled` is False."""

  def __init__(self, *, title: str, total_samples: int, train_examples: int,
               console: Console | None = None, enabled: bool = True):
    self._console = console or Console(stderr=True)
    self._enabled = enabled
    self._live = enabled and self._console.is_terminal
    self._title = title
    self._total = total_samples
    self._train_examples = train_examples
    self._samples = 0
    self._last_eval = "-"
    self._t0 = time.perf_counter()
    self._rate_t, self._rate_samples, self._rate = self._t0, 0, 0.0
    self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                         TextColumn("epoch {task.fields[epoch]:.2f}"),
                         TextColumn("{task.fields[rate]:,.0f} samples/s{task.fields[mfu]}"),
                         TextColumn("eval {task.fields[last_eval]}"),
                         TimeElapsedColumn(), console=self._console, transient=True)
    self._task: Any = None
    self._flops_per_sample, self._peak = 0.0, 0.0

  def utilization(self, flops_per_sample: float, peak_flops_per_s: float) -> None:
    """Model FLOPs of one sample and the devices' peak: the line then shows MFU."""
    self._flops_per_sample, self._peak = flops_per_sample, peak_flops_per_s

  def _mfu(self, samples_per_s: float) -> str:
    if not self._flops_per_sample:
      return ""
    rate = samples_per_s * self._flops_per_sample
    mfu = f", MFU {100 * rate / self._peak:.1f}%" if self._peak else ""
    return f"  {rate / 1e12:,.3g} TFLOP/s{mfu}"

  def __enter__(self) -> RunProgress:
    if self._live:
      self._bar.start()
      self._task = self._bar.add_task(self._title, total=self._total, epoch=0.0, rate=0.0,
                                      last_eval=self._last_eval, mfu="")
    return self

  def __exit__(self, *exc: Any) -> None:
    if self._live:
      self._bar.stop()

  def advance(self, samples: int) -> None:
    self._samples += samples
    now = time.perf_counter()
    if now - self._rate_t >= 1.0:
      self._rate = (self._samples - self._rate_samples) / (now - self._rate_t)
      self._rate_t, self._rate_samples = now, self._samples
    if self._live:
      self._bar.update(self._task, completed=self._samples, rate=self._rate,
                       epoch=self._samples / self._train_examples, mfu=self._mfu(self._rate))

  def evaluated(self, epoch: float, name: str, value: float, seconds: float,
                samples_per_s: float) -> None:
    self._last_eval = f"{name}={value:.4f}"
    if self._live:
      self._bar.update(self._task, last_eval=self._last_eval)
    elif self._enabled:
      self._console.print(f"{self._title}: epoch {epoch:g}  {self._last_eval}  "
                          f"{samples_per_s:,.0f} samples/s{self._mfu(samples_per_s)}  "
                          f"{seconds:.1f} s", highlight=False)

  def note(self, text: str) -> None:
    if self._enabled:
      self._console.print(text, highlight=False)
