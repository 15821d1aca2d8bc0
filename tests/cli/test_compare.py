"""`mlbench compare`: scores equal to result_summarizer's, outputs, speedups, invalid results."""

from __future__ import annotations

import csv
import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mlperf_logging.result_summarizer import result_summarizer

from mlbench.verify import compare
from mlbench.cli import main

DATA = Path(__file__).parents[1] / "data" / "mlperf-results"
PACKAGES = {"v0.7/Google": "0.7.0", "v4.0/NVIDIA": "4.0.0", "v4.0/Dell": "4.0.0"}

# result_summarizer on a one-system copy of a package (it rewrites scaling.json and
# prints tracebacks for v0.7): {benchmark: minutes}.
SUMMARIZE = """
import contextlib, io, json, sys
from mlperf_logging.result_summarizer import result_summarizer as rs
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    strong = rs.summarize_results(sys.argv[1], "training", sys.argv[2])[0]
row = strong.to_dict("records")[0]
print(json.dumps({k: v for k, v in row.items() if isinstance(v, float) and v == v}))
"""


def _summarizer(package: Path, system: str, ruleset: str, tmp: Path) -> dict[str, float]:
  copy = tmp / f"{package.name}-{system}"
  shutil.copytree(package / "results" / system, copy / "results" / system)
  (copy / "systems").mkdir()
  shutil.copy(package / "systems" / f"{system}.json", copy / "systems")
  out = subprocess.run([sys.executable, "-c", SUMMARIZE, str(copy), ruleset],
                       capture_output=True, text=True, check=True)
  return json.loads(out.stdout)


@pytest.fixture(scope="module")
def entries():
  return compare.compare([DATA / p for p in PACKAGES])


def test_scores_equal_result_summarizers(entries, tmp_path):
  checked = 0
  for package, ruleset in PACKAGES.items():
    root = DATA / package
    for system in sorted(p.name for p in (root / "results").iterdir()):
      theirs = _summarizer(root, system, ruleset, tmp_path)
      ours = {e.bench.benchmark: e.score for e in entries
              if e.source == root and e.bench.system == system}
      assert set(ours) == set(theirs), (system, ours, theirs)
      for bench, minutes in theirs.items():
        assert ours[bench] == pytest.approx(minutes, abs=1e-3), (system, bench)
        checked += 1
  assert checked == 15


def test_the_published_numbers(entries):
  """The scores the summarizer prints for the v0.7 TPU-v3-8192 JAX entries (in minutes)."""
  jax = {e.bench.benchmark: e for e in entries if e.bench.system == "tpu-v3-8192-JAX"}
  assert {b: round(e.score, 4) for b, e in jax.items()} == {
      "bert": 0.4002, "resnet": 0.4717, "transformer": 0.2576}
  assert jax["resnet"].gbs == 65536 and jax["resnet"].samples_to_converge == pytest.approx(92.0)


def test_speedups_compare_runs_to_the_same_target_only(entries):
  by = {(e.bench.system, e.bench.benchmark): e for e in entries}
  base = by[("tpu-v3-8192-JAX", "resnet")]
  assert base.speedup == 1.0
  nvidia = by[("eos_n8_ngc24.04_mxnet", "resnet")]
  assert nvidia.speedup == pytest.approx(base.score / nvidia.score)
  assert nvidia.rcp == "Pass" and nvidia.scaling == pytest.approx(1.0042232277526395)
  # ssd was SSD-ResNet34 (target 0.23) in 0.7.0 and RetinaNet (0.34) in 4.0.0.
  assert by[("eos_n8_ngc24.04_pytorch", "ssd")].speedup == 1.0
  assert by[("tpu-v3-8192-TF", "ssd")].speedup == pytest.approx(
      by[("tpu-v3-4096-JAX", "ssd")].score / by[("tpu-v3-8192-TF", "ssd")].score)


def test_olympic_average_matches_the_summarizers():
  rng = random.Random(0)
  for _ in range(200):
    n = rng.randint(3, 10)
    times = [rng.uniform(1, 10) for _ in range(n)]
    dropped = rng.randint(0, 2)
    max_dropped = rng.choice([1, 4])
    theirs = (None if dropped > max_dropped else
              result_summarizer._compute_olympic_average(list(times), dropped, max_dropped))
    assert compare.olympic(times, dropped, max_dropped) == theirs


def test_more_than_one_non_converged_run_is_invalid(tmp_path):
  root = tmp_path / "NVIDIA"
  shutil.copytree(DATA / "v4.0/NVIDIA", root)
  log = root / "results/eos_n8_ngc24.04_mxnet/resnet/result_0.txt"  # result_4 already misses
  log.write_text("".join(  # the target; now this one too.
      re.sub(r'"value": [0-9.]+', '"value": 0.5', ln) if '"eval_accuracy"' in ln else ln
      for ln in log.read_text().splitlines(keepends=True)))
  [e] = [e for e in compare.compare([root]) if e.bench.benchmark == "resnet"]
  assert e.dropped == 2 and e.score is None
  # The RCP reader counts convergence by run_stop's status, which result_0 still gives as a
  # success: result_summarizer reports samples_to_converge 35.0 for this folder (checked by
  # running it on this copy), and so does compare.
  assert e.samples_to_converge == 35.0


def test_outputs_are_written_once_and_never_overwritten(capsys, tmp_path):
  out = {k: tmp_path / f"cmp.{k}" for k in ("csv", "json", "png")}
  code = main(["compare", str(DATA / "v0.7/Google"), str(DATA / "v4.0/Dell"),
               "--csv", str(out["csv"]), "--json", str(out["json"]), "--plot", str(out["png"])])
  got = capsys.readouterr()  # the table is the product: stdout
  assert code == 0 and "MLPerf scores" in got.out and "MLPerf scores" not in got.err
  assert "Traceback" not in got.err
  rows = list(csv.DictReader(out["csv"].open()))
  assert len(rows) == 5  # 4 Google systems, 1 Dell
  for column in ("division", "submitter", "system", "resnet:time_to_train", "resnet:GBS",
                 "resnet:samples_to_converge", "resnet:RCP", "resnet:rcp_scaling_factor",
                 "resnet:speedup"):
    assert column in rows[0]
  doc = json.loads(out["json"].read_text())
  assert len(doc["rows"]) == 5 and all(e["runs"] for e in doc["entries"])
  assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out["png"].stat().st_size > 50_000
  before = out["csv"].read_bytes()
  code = main(["compare", str(DATA / "v4.0/Dell"), "--csv", str(out["csv"])])
  assert code == 2 and "already exists" in capsys.readouterr().err
  assert out["csv"].read_bytes() == before


def test_a_system_folder_compares_its_benchmarks_as_its_package_does(entries, capsys):
  """results/<system>, e.g. Google's results/tpu-v3-8192-JAX: each benchmark folder in it,
  scored as in the whole package (its system description found beside results/)."""
  system = DATA / "v0.7/Google/results/tpu-v3-8192-JAX"
  got = {e.bench.benchmark: e for e in compare.compare([system])}
  want = {e.bench.benchmark: e for e in entries if e.bench.system == "tpu-v3-8192-JAX"}
  assert set(got) == set(want) == {"bert", "resnet", "transformer"}
  for bench, e in got.items():
    assert e.score == want[bench].score and e.gbs == want[bench].gbs, bench
  assert main(["compare", str(system)]) == 0
  assert "tpu-v3-8192-JAX" in capsys.readouterr().out


def test_a_single_log_is_not_a_submission(capsys):
  log = DATA / "v4.0/Dell/results/XE9680x8H100-SXM-80GB/resnet/result_0.txt"
  assert main(["compare", str(log)]) == 2
  assert "compare needs result folders" in capsys.readouterr().err


DETAILED = SUMMARIZE.replace("summarize_results(sys.argv[1], \"training\", sys.argv[2])[0]",
                             "summarize_results(sys.argv[1], \"training\", sys.argv[2])[2]")


@pytest.mark.slow
@pytest.mark.parametrize("division", ["closed", "open"])
def test_samples_to_converge_and_gbs_as_the_summarizer_reports_them(tmp_path, division):
  # result_summarizer.py L518-571 fills <benchmark>:GBS and :samples_to_converge under
  # `if division == 'closed'` only; an open submission shows neither.
  root = tmp_path / "Dell"
  shutil.copytree(DATA / "v4.0/Dell", root)
  system = root / "systems/XE9680x8H100-SXM-80GB.json"
  system.write_text(json.dumps({**json.loads(system.read_text()), "division": division}))
  out = subprocess.run([sys.executable, "-c", DETAILED, str(root), "4.0.0"],
                       capture_output=True, text=True, check=True)
  theirs = json.loads(out.stdout)
  [e] = [e for e in compare.compare([root]) if e.bench.benchmark == "resnet"]
  assert e.samples_to_converge == theirs.get("resnet:samples_to_converge")
  assert e.gbs == theirs.get("resnet:GBS")
  assert (e.gbs is None) == (division == "open")


@pytest.mark.parametrize("option", ["--csv", "--json", "--plot"])
def test_an_output_folder_is_checked_before_any_work(capsys, tmp_path, option):
  # The missing input comes first on the command line; the output is refused first.
  out = tmp_path / "missing" / "out.txt"
  assert main(["compare", str(tmp_path / "no-such-package"), option, str(out)]) == 2
  err = capsys.readouterr().err
  assert err == f"error: {option} {out}: {out.parent} does not exist; create it first\n"
  assert main(["compare", str(DATA / "v4.0/Dell"), option, "/dev/null/out.txt"]) == 2
  assert capsys.readouterr().err.endswith(": /dev/null is not a folder\n")


@pytest.mark.parametrize("where, content, message", [
    ("systems/XE9680x8H100-SXM-80GB.json", b"\xff\xfe{}",
     " is not UTF-8 text (byte 0xff at offset 0)"),
    ("systems/XE9680x8H100-SXM-80GB.json", b"[1, 2]", " holds a JSON list, not an object"),
    ("results/XE9680x8H100-SXM-80GB/ssd/scaling.json", b'{"scaling_factor": "1,2"}',
     " holds no scaling_factor (ValueError: "),
    ("results/XE9680x8H100-SXM-80GB/ssd/scaling.json", b'{"scaling_factor": 0}',
     ": scaling_factor 0.0 is not a positive number"),
], ids=["system not UTF-8", "system a list", "scaling not a number", "scaling 0"])
def test_an_unreadable_system_or_scaling_file_is_a_one_line_error(capsys, tmp_path, where, content,
                                                                  message):
  root = tmp_path / "Dell"
  shutil.copytree(DATA / "v4.0/Dell/results/XE9680x8H100-SXM-80GB/ssd",
                  root / "results/XE9680x8H100-SXM-80GB/ssd")
  shutil.copytree(DATA / "v4.0/Dell/systems", root / "systems")
  (root / where).write_bytes(content)
  assert main(["compare", str(root)]) == 2
  err = capsys.readouterr().err
  assert err.startswith(f"error: {root / where}{message}") and err.count("\n") == 1, err


def _note(value):
  return ":::MLLOG " + json.dumps({"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME",
                                   "key": "note", "value": value, "metadata": {}}) + "\n"


def test_a_log_the_official_tools_cannot_judge_is_not_judged_not_not_converged(capsys, tmp_path):
  root = tmp_path / "Dell"
  bench = root / "results/XE9680x8H100-SXM-80GB/ssd"
  shutil.copytree(DATA / "v4.0/Dell/results/XE9680x8H100-SXM-80GB/ssd", bench)
  shutil.copytree(DATA / "v4.0/Dell/systems", root / "systems")
  for name, extra in (("result_1.txt", _note("x" * 300_000)),  # hours in the official parser
                      # The most the screen lets through: 4 s of regex on an idle core.
                      ("result_2.txt", _note("y" * 64_000) * 4)):
    lines = (bench / name).read_text().splitlines(keepends=True)
    (bench / name).write_text("".join(lines[:30]) + extra + "".join(lines[30:]))
  out = tmp_path / "cmp.json"
  assert main(["compare", str(root), "--ruleset", "4.0.0", "--timeout", "2", "--json",
               str(out)]) == 0
  table = capsys.readouterr().out
  [e] = json.loads(out.read_text())["entries"]
  problems = [r["not_judged"] for r in e["runs"]]
  assert problems[1].startswith("not run: line 31 is 300,1") and "would stall" in problems[1]
  assert problems[2].startswith("timed out after 2 s reading result_2.txt, near line 3")
  assert problems[0] is problems[3] is problems[4] is None and e["runs"][0]["converged"]
  assert e["score_minutes"] is None and e["samples_to_converge"] is None and e["speedup"] is None
  assert e["rcp"] == "Not run (result_1.txt not judged)" and e["rcp_factor"] is None
  assert "not judged" in table and "36.295? " in table and "*" not in table.split("\n* ")[0]
  assert f"? not judged, so ssd on XE9680x8H100-SXM-80GB has no score: {bench}/result_2.txt: " \
         "timed out after 2 s" in table.replace("\n", " ")


def test_the_table_goes_to_stdout_the_notes_to_stderr(tmp_path):
  """`mlbench compare PKG > table.txt` keeps the table (and its legend); notes go to stderr."""
  root = tmp_path / "Dell"
  shutil.copytree(DATA / "v4.0/Dell/systems", root / "systems")
  shutil.copytree(DATA / "v4.0/Dell/results/XE9680x8H100-SXM-80GB/ssd",
                  root / "results/XE9680x8H100-SXM-80GB/ssd")
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True).stdout.strip()
  (root / f"results/XE9680x8H100-SXM-80GB/ssd/pending_{dead}_0123abcd.log").write_text("killed")
  table = tmp_path / "table.txt"
  with open(table, "w") as stdout:
    done = subprocess.run([sys.executable, "-c", "import sys; from mlbench.cli import main; "
                           "sys.exit(main())", "compare", str(root)], stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=300)
  out = table.read_text()
  assert done.returncode == 0, done.stderr
  assert "MLPerf scores" in out and "XE9680x8H100-SXM-80GB" in out and "* did not converge" in out
  assert "MLPerf scores" not in done.stderr and "note: ignoring 1 log(s) of killed runs" in \
      done.stderr and "note:" not in out
