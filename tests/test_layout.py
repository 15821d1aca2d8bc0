"""The package layout is the architecture: imports flow one way between the wings.

    cli -> {train, pod, verify, datasets} -> base (the top-level modules and storage/)

`pod` may use `train` (it compiles the same steps a run compiles); `verify`
never imports `train` or JAX (validating a log needs no accelerator stack); the
base imports no wing. A workload imports only itself, `workloads/common/` and the
plugin API; the package never imports a workload (it reaches one through the registry).
No file imports itself back through others, and no part of the tree imports one that
imports it: the parts stand in layers, every import pointing down. Every import is found
with `ast`, including those inside function bodies (the CLI imports heavy modules lazily).
The package is what `mlbench` runs: it reads no folder only the repository has (tests/,
shared/, benchmarks/: the calibration tooling lives there) and has no scripts of its own
(its command line is `mlbench.cli`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
WINGS = ("cli", "train", "pod", "verify", "datasets")
BASE_PACKAGES = ("storage",)
"""Folders of the base: what both wings share, kept together (the path layer and writes)."""
TOP_MODULES = {"workload", "convention", "config", "fields", "rules", "registry", "mllog",
               "resultlog", "compliance", "errors", "accelerators", "system"}
"""The base's top-level modules: at most 12, so a newcomer finds their room from `ls`."""
# What each part of the package may import from mlbench (besides the base).
ALLOWED = {"base": set(), "cli": {"cli", "train", "pod", "verify", "datasets"},
           "train": {"train"}, "pod": {"pod", "train"}, "verify": {"verify"},
           "datasets": {"datasets"}}
# The plugin API: the contract, the helpers of its configs and errors, the path layer (a
# data_dir may be a bucket), and the helpers of the run side (everything else in
# mlbench.train, the loop, the clock, steps, ..., belongs to the harness) and of the data
# side (the TFRecord and Megatron formats, which write the mini datasets as `mlbench data`
# writes the full ones).
PLUGIN_API = {"mlbench.workload", "mlbench.convention", "mlbench.fields", "mlbench.errors",
              "mlbench.storage.paths"}
PLUGIN_HELPERS = {"mlbench.train.data", "mlbench.train.optim", "mlbench.train.layers",
                  "mlbench.train.attention",
                  "mlbench.datasets.records", "mlbench.datasets.indexed"}
HEAVY = ("jax", "jaxlib", "flax", "optax", "tensorflow")
REPOSITORY_ONLY = ("tests", "shared", "benchmarks", "docs", "examples", "mlperf-results")
"""Folders of the repository an installed mlbench does not have (rules/ it packs inside)."""


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


def _tree_files() -> list[Path]:
  """The package's files and the workloads'."""
  return _package_files() + sorted((ROOT / "workloads").rglob("*.py"))


def _module_file(module: str) -> Path | None:
  """The file of a dotted module of this tree; None for another package's."""
  base = ROOT.joinpath(*module.split("."))
  return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def _targets(path: Path) -> set[Path]:
  """The files of this tree that a file imports: the module itself for `from a import b`
  where a.b is one, else the module the names come from."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      modules = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      modules = [f"{node.module}.{a.name}" if _module_file(f"{node.module}.{a.name}")
                 else node.module for a in node.names]
    else:
      continue
    found |= {f for f in map(_module_file, modules) if f is not None}
  return found - {path}


def _room(path: Path) -> str:
  """The part of the tree a file is in: a folder of mlbench/ (a wing, storage/), a module at
  its top, or a workload package (workloads/common/ among them)."""
  rel = path.relative_to(ROOT).parts
  return "/".join(rel[:2]) + ("/" if len(rel) > 2 else "")


def _cycle(graph: dict) -> list | None:
  """One cycle of a directed graph {node: {node, ...}}, as [a, b, ..., a]; None if none."""
  done, path = set(), []

  def visit(node):
    if node in path:
      return path[path.index(node):] + [node]
    if node in done:
      return None
    path.append(node)
    for nxt in sorted(graph.get(node, ()), key=str):
      found = visit(nxt)
      if found:
        return found
    path.pop()
    done.add(node)
    return None

  return next((c for n in sorted(graph, key=str) if (c := visit(n))), None)


def test_the_tree_shows_the_wings():
  assert {p.name for p in (ROOT / "mlbench").iterdir() if p.is_dir() and p.name != "__pycache__"
          } == set(WINGS) | set(BASE_PACKAGES), "a new folder: a wing, or a package of the base"
  top = {p.stem for p in (ROOT / "mlbench").glob("*.py")} - {"__init__"}
  assert top <= TOP_MODULES, "a new top-level module: put it in its wing, or add it to the base"
  assert len(TOP_MODULES) <= 12


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


def _plugin_api(module: str) -> bool:
  return any(module == m or module.startswith(m + ".") or m.startswith(module + ".")
             for m in PLUGIN_API | PLUGIN_HELPERS)


def test_a_workload_imports_only_itself_common_and_the_plugin_api():
  bad = []
  for path in sorted((ROOT / "workloads").rglob("*.py")):
    rel = path.relative_to(ROOT).parts
    own = {rel[1], "common"} if len(rel) > 2 else set()
    for line, mod in _imports(path):
      top, _, rest = mod.partition(".")
      if (top == "mlbench" and not _plugin_api(mod)) or (
          top == "workloads" and rest and rest.split(".")[0] not in own) or (
          own == {"common"} and top == "workloads" and rest.split(".")[0] != "common"):
        bad.append(f"{path.relative_to(ROOT)}:{line}: {mod}")
  assert not bad, f"a workload imports itself, workloads.common and the plugin API only: {bad}"


@pytest.mark.parametrize("path", _package_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_package_never_imports_a_workload(path):
  """mlbench reaches a workload through the registry (entry points), `mlbench data` a
  workload's format through the contract (`InputSpec.verify`): never by its module, in an
  import or in a string handed to importlib."""
  tree = ast.parse(path.read_text(), str(path))
  docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
  named = [f"line {n.lineno}: {n.value}" for n in ast.walk(tree)
           if isinstance(n, ast.Constant) and isinstance(n.value, str)
           and id(n) not in docstrings and n.value.startswith("workloads.")]
  imported = [f"line {line}: {mod}" for line, mod in _imports(path)
              if mod.split(".")[0] == "workloads"]
  assert not imported + named


def test_no_file_imports_itself_back():
  cycle = _cycle({f: _targets(f) for f in _tree_files()})
  assert cycle is None, " -> ".join(str(p.relative_to(ROOT)) for p in cycle)


def test_every_import_points_down():
  """The parts of the tree (the wings, storage/, the top modules, each workload package)
  stand in layers: no part imports one that imports it, straight or through others."""
  rooms: dict[str, set[str]] = {}
  for f in _tree_files():
    rooms.setdefault(_room(f), set()).update(_room(t) for t in _targets(f))
  cycle = _cycle({room: targets - {room} for room, targets in rooms.items()})
  assert cycle is None, "an import points back up: " + " -> ".join(cycle)


def _repository_paths(path: Path) -> list[str]:
  """Path parts a file joins (`/`, `joinpath`, `Path(...)`, `os.path.join`) that name a
  folder only the repository has."""
  found = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
      parts = [node.left, node.right]
    elif isinstance(node, ast.Call) and (
        getattr(node.func, "attr", None) in ("joinpath", "join")
        or getattr(node.func, "id", None) in ("Path", "path")):
      parts = node.args
    else:
      continue
    found += [f"line {node.lineno}: {part.value!r}" for part in parts
              if isinstance(part, ast.Constant) and isinstance(part.value, str)
              and part.value.strip("/").split("/")[0] in REPOSITORY_ONLY]
  return found


@pytest.mark.parametrize("path", _package_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_package_reads_nothing_only_the_repository_has(path):
  """What the package reads at run time is inside it (`importlib.resources`: the
  accelerator specs and the fitted constants, the calibration's cost table; the rules,
  which a wheel packs): never tests/data or shared/mlperf-results, found by walking up
  from a module's file. Tooling that needs them takes them as arguments, outside."""
  assert not _repository_paths(path)


@pytest.mark.parametrize("path", _package_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_package_has_no_scripts(path):
  """The command line is `mlbench` (click, `mlbench.cli`); research scripts with argparse
  and a `__main__` block belong to benchmarks/."""
  tree = ast.parse(path.read_text(), str(path))
  mains = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Compare)
           and isinstance(n.left, ast.Name) and n.left.id == "__name__"]
  argparse = [line for line, mod in _imports(path) if mod.split(".")[0] == "argparse"]
  assert not mains + argparse, f"lines {mains + argparse}: a script; make it a command or a tool"


def test_the_checker_finds_repository_paths_and_scripts(tmp_path):
  """The two tests above would pass vacuously if they found nothing."""
  sample = tmp_path / "sample.py"
  sample.write_text("import argparse\nfrom pathlib import Path\n"
                    "DATA = Path(__file__).parents[2] / 'tests' / 'data'\n"
                    "KEYS = {'examples': 1, 'tests': 2}\n"
                    "ROOT = next(p / 'shared/mlperf-results' for p in Path(__file__).parents)\n")
  assert _repository_paths(sample) == ["line 3: 'tests'", "line 5: 'shared/mlperf-results'"]
  assert [m for _, m in _imports(sample)] == ["argparse", "pathlib", "pathlib.Path"]


def test_one_reader_of_logs_and_one_plan():
  """MLPerf logs are read in one place (`mlbench.resultlog`: what validate, compare and
  check --from-log share), and one class is the `Plan` (of a run, `mlbench.train.plan`)."""
  readers, plans = set(), []
  for path in _package_files():
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
          node.value.startswith(":::MLL")):
        readers.add(str(path.relative_to(ROOT)))
      if isinstance(node, ast.ClassDef) and node.name.lstrip("_") == "Plan":
        plans.append(str(path.relative_to(ROOT)))
  assert readers == {"mlbench/resultlog.py"}
  assert plans == ["mlbench/train/plan.py"]


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


def test_the_checker_finds_files_and_cycles():
  """The tests of cycles would pass vacuously if `_targets` or `_cycle` found nothing."""
  runner = ROOT / "mlbench" / "train" / "runner.py"
  assert {ROOT / "mlbench/train/loop.py", ROOT / "mlbench/train/lifecycle/checkpoint.py",
          ROOT / "mlbench/storage/paths.py"} <= _targets(runner)
  assert _room(runner) == "mlbench/train/"
  assert _room(ROOT / "mlbench/config.py") == "mlbench/config.py"
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
  assert not _plugin_api("mlbench.train.loop") and _plugin_api("mlbench.workload.Split")

def test_test_files_have_distinct_names():
  # Test folders are not packages: pytest imports each file by its basename, and a second
  # file of the same name is not collected at all ("import file mismatch").
  seen: dict[str, list[str]] = {}
  for path in (ROOT / "tests").rglob("test_*.py"):
    if not (path.parent / "__init__.py").exists():
      seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
  assert not {name: where for name, where in seen.items() if len(where) > 1}

