"""Finds workload plugins through the `mlbench.workloads` entry-point group.

Built-in workloads register the same way as third-party ones (see
pyproject.toml), so there is one discovery path and no import-order magic.
Loading a plugin imports only its module; heavy imports happen when its
callables run.
"""

from __future__ import annotations

from importlib import metadata

from mlbench.errors import UserError, choices
from mlbench.workload import Workload

GROUP = "mlbench.workloads"


def _entry_points() -> dict[str, metadata.EntryPoint]:
  return {ep.name: ep for ep in metadata.entry_points(group=GROUP)}


def names() -> list[str]:
  """Names of all registered workloads, sorted."""
  return sorted(_entry_points())


def get(name: str) -> Workload:
  """Loads the workload registered as `name`.

  Raises:
    UserError: no such workload (the message lists the registered ones), or
      the entry point does not name a `Workload`.
  """
  eps = _entry_points()
  if name not in eps:
    if not eps:
      raise UserError(f"no workloads are registered under '{GROUP}'; "
                      "install mlbench with `pip install -e .`")
    raise UserError(f"unknown workload '{name}'; choose one of: {choices(eps)}")
  obj = eps[name].load()
  if not isinstance(obj, Workload):
    raise UserError(f"entry point '{name}' ({eps[name].value}) is a {type(obj).__name__}, "
                    "not an mlbench.workload.Workload; fix the plugin's entry point")
  if obj.name != name:
    raise UserError(f"entry point '{name}' loads workload '{obj.name}'; "
                    "make the entry-point name equal Workload.name")
  return obj


def all_workloads() -> list[Workload]:
  """Every registered workload, sorted by name."""
  return [get(n) for n in names()]
