"""Workload discovery through the mlbench.workloads entry-point group."""

from __future__ import annotations

import dataclasses
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


def _lazy_references(w: Workload) -> dict[str, object]:
  """Every callable of a workload that imports its target on first use, by field."""
  found = {}
  for part, value in [("", w), ("input.", w.input), ("eval.", w.eval)]:
    for f in dataclasses.fields(value):
      if hasattr(getattr(value, f.name), "resolve"):
        found[part + f.name] = getattr(value, f.name)
  return found


def test_every_lazy_reference_of_every_workload_resolves():
  """A misspelt member or module would otherwise surface only when a run first calls it."""
  for w in registry.all_workloads():
    refs = _lazy_references(w)
    assert {"init", "loss", "input.files", "eval.step", "eval.compute"} <= set(refs), w.name
    for where, fn in refs.items():
      assert callable(fn.resolve()), f"{w.name}.{where} -> {fn.target}"


def test_a_plugin_package_registers_by_convention(tmp_path, monkeypatch):
  """A third-party package laid out as the built-in ones calls `from_package` and names
  only what differs; its entry point is all mlbench needs."""
  pkg = tmp_path / "tinyres"
  pkg.mkdir()
  (pkg / "__init__.py").write_text(textwrap.dedent("""
      from mlbench.convention import from_package
      WORKLOAD = from_package(__name__, benchmark="resnet", quality_metric="accuracy",
                              elsewhere={"prepare": "data"})
      """))
  for module, source in [("config", "config"), ("train", "train"),
                         ("input_pipeline", "input_pipeline"), ("data", "digits")]:
    (pkg / f"{module}.py").write_text(f"from workloads.resnet50.{source} import *  # noqa\n")
  info = tmp_path / "tinyres-0.1.dist-info"
  info.mkdir()
  (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tinyres\nVersion: 0.1\n")
  (info / "entry_points.txt").write_text("[mlbench.workloads]\ntinyres = tinyres:WORKLOAD\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  w = registry.get("tinyres")
  refs = _lazy_references(w)
  assert refs["input.prepare"].target == "tinyres.data:prepare"
  assert refs["init"].resolve() is refs["init"].resolve() and "layer_stack" not in refs
  from workloads.resnet50 import train

  assert refs["init"].resolve() is train.init and w.configs["mini"]().model.num_classes == 10
  for name in [n for n in sys.modules if n == "tinyres" or n.startswith("tinyres.")]:
    sys.modules.pop(name)


def test_a_misnamed_member_fails_with_the_valid_names():
  from mlbench.convention import from_package

  with pytest.raises(TypeError, match=r"also=...\): no member layer_stak; choose from: .*"
                                      r"layer_stack"):
    from_package("workloads.bert", benchmark="bert", quality_metric="accuracy",
                 also=("layer_stak",))
