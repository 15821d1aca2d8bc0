"""Static checks: undefined names, unused imports and syntax errors fail the suite."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff comes with the test extra")
def test_ruff_finds_no_errors():
  out = subprocess.run(["ruff", "check", "--select", "F,E9", "mlbench", "workloads", "tests",
                        "benchmarks"], cwd=ROOT, capture_output=True, text=True)
  assert out.returncode == 0, out.stdout
