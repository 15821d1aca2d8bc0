"""What git holds: text, and the docs' pictures; never an archive or a binary."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
ARCHIVES = (".whl", ".zip", ".tar", ".gz", ".tgz", ".bz2", ".xz", ".7z", ".egg", ".jar",
            ".deb", ".rpm", ".so", ".dylib", ".dll", ".exe", ".pyc", ".npz", ".npy", ".pkl")
PICTURES = (".png", ".jpg", ".jpeg", ".gif", ".svg")
"""The README's and docs' pictures: the only files git may hold that are not text."""


def _tracked() -> list[Path]:
  if shutil.which("git") is None or not (ROOT / ".git").exists():
    pytest.skip("not a git checkout")
  out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
  return [ROOT / name for name in out.stdout.decode().split("\0") if name]


def _not_text(files: list[tuple[Path, str]]) -> list[str]:
  """Of (path, name in the repository) pairs, the names of archives and binary files
  (a NUL byte in their first 8 KiB), but for pictures under docs/."""
  found = []
  for path, rel in files:
    if not path.is_file():  # deleted in the working tree, not yet committed
      continue
    if path.suffix.lower() in PICTURES and rel.startswith("docs/"):
      continue
    with path.open("rb") as f:
      binary = b"\0" in f.read(8192)
    if path.name.lower().endswith(ARCHIVES) or binary:
      found.append(rel)
  return found


def test_git_holds_no_archives_or_binaries():
  """A wheel committed by accident (py_spy's, 2.9 MB, nothing read it) makes every clone
  pay for it, and no review can read it: git holds text, and the docs' pictures."""
  found = _not_text([(p, str(p.relative_to(ROOT))) for p in _tracked()])
  assert not found, f"archives or binaries in git: {found}; remove them (git rm)"


def test_the_check_finds_archives_and_binaries(tmp_path):
  """The test above would pass vacuously if `_not_text` missed what it is for."""
  files = {"py_spy-0.4.3-py2.py3-none-manylinux1_x86_64.whl": b"PK\x03\x04 a zip",
           "tools/probe": b"\x7fELF\x02\x01\x01\0", "README.md": b"# text\n",
           "docs/plan.png": b"\x89PNG\r\n\x1a\n\0\0", "plot.png": b"\x89PNG\r\n\x1a\n\0\0"}
  for name, data in files.items():
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_bytes(data)
  assert _not_text([(tmp_path / n, n) for n in files]) == [
      "py_spy-0.4.3-py2.py3-none-manylinux1_x86_64.whl", "tools/probe", "plot.png"]
