"""result_summarizer's scores against `mlbench compare`'s, for validate_agreement.py --scores.

Both run on copies of a package (both rewrite scaling.json): result_summarizer's
time_to_train and samples_to_converge per system folder and benchmark, `mlbench compare`'s
score and samples to converge, and the values that differ.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

_SCORES = """
import contextlib, io, json, logging, sys, warnings
logging.disable(logging.CRITICAL)
warnings.simplefilter("ignore")
from mlperf_logging.result_summarizer import result_summarizer as rs
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
  detailed = rs.summarize_results(sys.argv[1], "training", sys.argv[2])[2]
out = {}
for _, row in detailed.iterrows():
  # The system folder is the file name in details_url (system_name need not be unique).
  system = str(row.get("details_url", "")).rsplit("/", 1)[-1].removesuffix(".json")
  for col, v in row.items():
    if str(col).endswith((":time_to_train", ":samples_to_converge")) and v == v and v is not None:
      out.setdefault(system, {})[col] = float(v)
print(json.dumps(out))
"""


def official_scores(python: str, package: Path, ruleset: str, limit_s: float) -> dict:
  """result_summarizer's time_to_train and samples_to_converge per system folder and
  benchmark (on a copy: it rewrites scaling.json), and its seconds."""
  with tempfile.TemporaryDirectory(prefix="agree-summ-") as tmp:
    copy = Path(tmp) / package.name
    shutil.copytree(package, copy)
    t0 = time.perf_counter()
    try:
      proc = subprocess.run([python, "-c", _SCORES, str(copy), ruleset], capture_output=True,
                            text=True, timeout=limit_s, cwd=tmp, check=False)
    except subprocess.TimeoutExpired:
      return {"error": f"no scores in {limit_s:.0f} s"}
  if proc.returncode != 0:
    return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][:200]}
  return {"scores": json.loads(proc.stdout), "seconds": time.perf_counter() - t0}


def mlbench_scores(python: str, repo: Path, package: Path, ruleset: str, limit_s: float) -> dict:
  """`mlbench compare`'s score and samples to converge per system folder and benchmark."""
  code = "import sys; from mlbench.cli import main; sys.exit(main())"
  env = dict(os.environ, PYTHONPATH=str(repo))
  with tempfile.TemporaryDirectory(prefix="agree-compare-") as tmp:
    copy, out = Path(tmp) / package.name, Path(tmp) / "scores.json"
    shutil.copytree(package, copy)
    t0 = time.perf_counter()
    try:
      proc = subprocess.run([python, "-c", code, "compare", "--ruleset", ruleset, "--json",
                             str(out), str(copy)], cwd=repo, env=env, capture_output=True,
                            text=True, timeout=limit_s, check=False)
    except subprocess.TimeoutExpired:
      return {"error": f"no scores in {limit_s:.0f} s"}
    if not out.is_file():
      return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][:200]}
    entries = json.loads(out.read_text())["entries"]
  scores: dict[str, dict[str, float | None]] = {}
  for e in entries:
    cols = scores.setdefault(e["system"], {})
    cols[f"{e['benchmark']}:time_to_train"] = e["score_minutes"]
    cols[f"{e['benchmark']}:samples_to_converge"] = e["samples_to_converge"]
  return {"scores": scores, "seconds": time.perf_counter() - t0}


def score_agreement(official: dict, ours: dict) -> tuple[int, int, list[str]]:
  """(values compared, equal, the differences): every time_to_train and
  samples_to_converge result_summarizer gives, against mlbench compare's."""
  if "error" in official or "error" in ours:
    return 0, 0, [f"scores: {official.get('error') or ours.get('error')}"]
  compared = equal = 0
  diffs = []
  for system, cols in official["scores"].items():
    mine = ours["scores"].get(system, {})
    for col, v in cols.items():
      compared += 1
      got = mine.get(col)
      if isinstance(got, (int, float)) and math.isclose(got, v, rel_tol=1e-9, abs_tol=1e-9):
        equal += 1
      else:
        diffs.append(f"{system} {col}: {v} vs {got}")
  return compared, equal, diffs
