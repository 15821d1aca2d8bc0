"""Hostile names never make mlbench write outside the folder the user named."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlbench.storage import paths, results
from mlbench.cli import main
from mlbench.errors import UserError

HOSTILE = ["../x", "/tmp/x", "a/../../x", "..", ".", "a\nb", "a b", "-rf", ".hidden", "", "x" * 129]


def _tree(root: Path) -> list[str]:
  return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("option", ["--system", "--submitter"])
@pytest.mark.parametrize("name", HOSTILE + ["a\x00b"])
def test_a_hostile_name_is_one_line_exit_2_and_writes_nothing(capsys, tmp_path, monkeypatch,
                                                              option, name):
  """In-process through the real CLI (a NUL cannot be passed in a process's argv)."""
  work = tmp_path / "work" / "deeper"
  work.mkdir(parents=True)
  monkeypatch.chdir(work)
  rc = main(["run", "resnet50", option, name, "--results-dir", "res"])
  err = capsys.readouterr().err
  assert rc == 2
  assert err.startswith(f"error: {option} ") and "is not a usable name" in err
  assert err.count("\n") == 1  # The name is shown with repr(): a newline stays on one line.
  assert _tree(tmp_path) == ["work", "work/deeper"]


@pytest.mark.parametrize("name", ["../x", "/tmp/x", "a/../../x", "a\nb"])
def test_a_hostile_name_in_a_real_process(mlbench, tmp_path, name):
  work = tmp_path / "work"
  work.mkdir()
  had_tmp_x = Path("/tmp/x").exists()
  out = mlbench("run", "resnet50", "--system", name, cwd=work, timeout=120)
  assert out.returncode == 2
  assert out.stderr.count("\n") == 1 and "--system" in out.stderr, out.stderr
  assert _tree(tmp_path) == ["work"]
  assert Path("/tmp/x").exists() == had_tmp_x


@pytest.mark.parametrize("name", ["cpu-2core", "1xnvidia-h100-80gb-hbm3", "4x8xtpu-v4", "NVIDIA",
                                  "a.b_c+d"])
def test_ordinary_names_pass(name):
  assert paths.check_name("--system", name) == name


def test_result_paths_check_their_names(tmp_path):
  with pytest.raises(UserError, match="system name '../x'"):
    results.benchmark_dir(tmp_path, "../x", "resnet")
  with pytest.raises(UserError, match="benchmark name '/etc'"):
    results.benchmark_dir(tmp_path, "cpu", "/etc")
  with pytest.raises(UserError, match="system name 'a/b'"):
    results.system_file(tmp_path, "a/b")
  assert results.benchmark_dir(tmp_path, "cpu", "resnet") == tmp_path / "results" / "cpu" / "resnet"


def test_a_link_out_of_the_results_dir_is_refused(tmp_path):
  outside = tmp_path / "outside"
  outside.mkdir()
  (tmp_path / "res" / "results").mkdir(parents=True)
  (tmp_path / "res" / "results" / "cpu").symlink_to(outside)
  with pytest.raises(UserError, match="outside"):
    results.benchmark_dir(tmp_path / "res", "cpu", "resnet")
  with pytest.raises(UserError, match="outside"):
    paths.inside(tmp_path / "res", tmp_path / "res" / ".." / "elsewhere")
  assert paths.inside(tmp_path / "res", tmp_path / "res" / "a" / "b") == (
      tmp_path / "res" / "a" / "b").resolve()
