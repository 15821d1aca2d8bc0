"""The package layout is the architecture: imports flow one way between the wings.

    cli -> {train, pod, verify, datasets} -> base (the top-level modules)

`pod` may use `train` (it compiles the same steps a run compiles); `verify`
never imports `train` or JAX (validating a log needs no accelerator stack); the
base imports no wing; workloads use only the base and the run side's helpers
for plugins. Every import is found with `ast`, including those inside function
bodies (the CLI imports heavy modules lazily).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
WINGS = ("cli", "train", "pod", "verify", "datasets")
# What each part of the package may import from mlbench (besides the base).
ALLOWED = {"base": set(), "cli": {"cli", "train", "pod", "verify", "datasets"},
           "train": {"train"}, "pod": {"pod", "train"}, "verify": {"verify"},
           "datasets": {"datasets"}}
# The helpers a workload plugin may build on: the run side's (everything else in
# mlbench.train, the loop, the clock, steps, ..., belongs to the harness) and the one
# TFRecord writer, which writes the mini datasets as `mlbench data` writes the full ones.
PLUGIN_HELPERS = {"mlbench.train.data", "mlbench.train.optim", "mlbench.train.layers",
                  "mlbench.train.attention",
                  "mlbench.datasets.records"}
HEAVY = ("jax", "jaxlib", "flax", "optax", "tensorflow")


def _part(path: Path) -> str:
  rel = path.relative_to(ROOT / "mlbench").parts
  return rel[0] if len(rel) > 1 and rel[0] in WINGS else "base"


def _imports(path: Path) -> list[tuple[int, str]]:
  """(line, dotted module) of every import in a file; `from a import b` gives a.b too."""
  found = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      found += [(node.lineno, a.name) for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      found.append((node.lineno, node.module))
      found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
  return found


def _wing_of(module: str) -> str | None:
  parts = module.split(".")
  if parts[0] != "mlbench" or len(parts) < 2:
    return None
  return parts[1] if parts[1] in WINGS else "base"


def _package_files() -> list[Path]:
  return sorted((ROOT / "mlbench").rglob("*.py"))


def test_the_tree_shows_the_wings():
  assert {p.name for p in (ROOT / "mlbench").iterdir() if p.is_dir() and p.name != "__pycache__"
          } >= set(WINGS)
  top = {p.stem for p in (ROOT / "mlbench").glob("*.py")} - {"__init__"}
  assert top <= {"workload", "convention", "config", "fields", "rules", "registry", "mllog",
                 "compliance", "errors", "accelerators", "system"
                 }, "a new top-level module: put it in its wing, or add it to the base"


@pytest.mark.parametrize("path", _package_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_flow_one_way(path):
  part = _part(path)
  bad = [f"line {line}: {mod}" for line, mod in _imports(path)
         if _wing_of(mod) not in (None, "base") and _wing_of(mod) not in ALLOWED[part]]
  assert not bad, f"{part} must not import these: {bad}"


@pytest.mark.parametrize("path", sorted((ROOT / "mlbench" / "verify").rglob("*.py")),
                         ids=lambda p: p.name)
def test_verify_never_needs_the_accelerator_stack(path):
  heavy = [f"line {line}: {mod}" for line, mod in _imports(path) if mod.split(".")[0] in HEAVY]
  assert not heavy


def test_workloads_use_only_the_plugin_api():
  bad = []
  for path in sorted((ROOT / "workloads").rglob("*.py")):
    for line, mod in _imports(path):
      wing = _wing_of(mod)
      helper = any(mod == h or mod.startswith(h + ".") or h.startswith(mod)
                   for h in PLUGIN_HELPERS)
      if wing in ("cli", "pod", "verify") or (wing in ("train", "datasets") and not helper):
        bad.append(f"{path.relative_to(ROOT)}:{line}: {mod}")
  assert not bad, bad


def test_workloads_compute_attention_through_the_entry_point():
  # jax.nn.dot_product_attention without implementation= is XLA's unfused attention on every
  # backend; mlbench.train.attention.attend picks each platform's fused kernel.
  calls = [f"{path.relative_to(ROOT)}:{i}" for path in sorted((ROOT / "workloads").rglob("*.py"))
           for i, line in enumerate(path.read_text().splitlines(), 1)
           if "dot_product_attention" in line]
  assert not calls, f"use mlbench.train.attention.attend: {calls}"


def test_the_checker_finds_a_wrong_way_import(tmp_path):
  """The test above would pass vacuously if `_imports` found nothing."""
  sample = tmp_path / "sample.py"
  sample.write_text("def f():\n  from mlbench.train import loop\n  import mlbench.verify.compare\n")
  assert [m for _, m in _imports(sample)] == ["mlbench.train", "mlbench.train.loop",
                                              "mlbench.verify.compare"]
  assert {_wing_of(m) for _, m in _imports(sample)} == {"train", "verify"}
