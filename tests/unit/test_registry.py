"""Workload discovery through the mlbench.workloads entry-point group."""

from __future__ import annotations

import sys
import textwrap

import pytest

from mlbench import registry
from mlbench.errors import UserError
from mlbench.workload import Workload


def test_builtins_register_through_entry_points():
  assert "resnet50" in registry.names()
  w = registry.get("resnet50")
  assert isinstance(w, Workload) and w.benchmark == "resnet"


def test_unknown_workload_lists_the_registered_ones():
  with pytest.raises(UserError, match="unknown workload 'resnet51'; choose one of: .*resnet50"):
    registry.get("resnet51")


def _install(tmp_path, name, body):
  """A real distribution on sys.path: a module plus a dist-info with entry_points.txt."""
  (tmp_path / f"{name}_plugin.py").write_text(textwrap.dedent(body))
  info = tmp_path / f"{name}_plugin-0.1.dist-info"
  info.mkdir()
  (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}-plugin\nVersion: 0.1\n")
  (info / "entry_points.txt").write_text(f"[mlbench.workloads]\n{name} = {name}_plugin:WORKLOAD\n")


def test_a_third_party_plugin_is_found_and_checked(tmp_path, monkeypatch):
  _install(tmp_path, "tinyclf", """
      import dataclasses
      from workloads import resnet50
      WORKLOAD = dataclasses.replace(resnet50.WORKLOAD, name="tinyclf")
      """)
  _install(tmp_path, "broken", "WORKLOAD = 42\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  assert {"tinyclf", "broken", "resnet50"} <= set(registry.names())
  assert registry.get("tinyclf").benchmark == "resnet"
  with pytest.raises(UserError, match="entry point 'broken' .* is a int, not an mlbench"):
    registry.get("broken")
  sys.modules.pop("tinyclf_plugin", None)
