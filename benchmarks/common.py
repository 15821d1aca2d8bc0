"""Shared by the benchmarks: side-by-side timing, the CPU other processes used, and the
full configs at one device's share of a batch (`config_for`).

On a shared 2-core box another tenant can halve a measurement, so every timed
window also records how many cores *other* processes kept busy (from
/proc/stat minus this process's own CPU time); ratios come from alternating
rounds of both variants, and the report gives the median.
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from collections.abc import Callable


def _busy_jiffies() -> tuple[float, float]:
  with open("/proc/stat") as f:
    fields = [float(x) for x in f.readline().split()[1:]]
  idle = fields[3] + fields[4]
  return sum(fields) - idle, sum(fields)


def _own_cpu_s() -> float:
  r = resource.getrusage(resource.RUSAGE_SELF)
  c = resource.getrusage(resource.RUSAGE_CHILDREN)
  return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime


def timed(fn: Callable[[], float]) -> tuple[float, float, float]:
  """Runs fn (which returns its work units) -> (units/s, seconds, foreign cores)."""
  hz = os.sysconf("SC_CLK_TCK")
  busy0, _ = _busy_jiffies()
  own0, t0 = _own_cpu_s(), time.perf_counter()
  units = fn()
  dt = time.perf_counter() - t0
  busy1, _ = _busy_jiffies()
  foreign = max(0.0, ((busy1 - busy0) / hz - (_own_cpu_s() - own0)) / dt)
  return units / dt, dt, foreign


def side_by_side(variants: dict[str, Callable[[], float] | tuple], rounds: int) -> dict[str, list]:
  """Alternates the variants `rounds` times; {name: [(rate, seconds, foreign), ...]}.

  A variant is fn() -> units, all of it timed, or (prepare, run): prepare()
  (untimed) returns what run(prepared) -> units needs.
  """
  out = {name: [] for name in variants}
  for _ in range(rounds):
    for name, variant in variants.items():
      if isinstance(variant, tuple):
        prepare, run = variant
        ready = prepare()
        out[name].append(timed(lambda: run(ready)))
      else:
        out[name].append(timed(variant))
  return out


def report(results: dict[str, list], unit: str, base: str, other: str) -> float:
  """Prints every round and the median ratio other/base; returns that ratio."""
  for name, rows in results.items():
    for rate, dt, foreign in rows:
      print(f"  {name:>14}: {rate:10,.1f} {unit}  ({dt:.2f} s, other processes "
            f"{foreign:.2f} cores)")
  ratios = [o[0] / b[0] for b, o in zip(results[base], results[other])]
  median = statistics.median(ratios)
  print(f"  ratio {other}/{base}: median {median:.3f} (rounds: "
        + ", ".join(f"{r:.3f}" for r in ratios) + ")")
  return median


# One device's share of a normal global batch for each full config.
FULL_BATCH = {"resnet50": 256, "bert": 32, "transformer": 256, "ssd": 32, "moe": 16,
              "llama31_8b": 1}
# Full configs that do not fit one device for training, cut in depth only.
FULL_REDUCED = {"moe": ("model.num_layers=4",), "llama31_8b": ("model.num_layers=4",)}


def config_for(name: str, config: str, precision: str, batch: int | None,
               more: tuple[str, ...] | list[str] = ()):
  """The workload, its config at `precision` and the batch, with the full-config cuts
  and `more` overrides."""
  from mlbench import config as config_lib, registry

  w = registry.get(name)
  _, cfg = config_lib.load(w, config)
  sets = [f"model.dtype={precision}", *more]
  if config == "full":
    sets += FULL_REDUCED.get(name, ())
    batch = batch or FULL_BATCH[name]
  if batch:
    sets.append(f"global_batch_size={batch}")
  return w, config_lib.override(cfg, sets)
