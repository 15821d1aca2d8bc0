"""`mlbench validate` against the official package checker on every published MLPerf package.

For each round fetched (mlcommons/training_results_v0.7 ... v5.0, bare git mirrors as the
`fetch` tool brings them: `<mirrors>/mlcommons+training_results_<round>/repo`), every
submitter's `results/` and `systems/` are extracted into a scratch folder (a benchmark
folder with a log the snapshot lacks is left out whole, and counted). Then, per package:

* the official verdict: `python -m mlperf_logging.package_checker <pkg> training <ruleset>`
  ("FOUND NO ERRORS" is PASS, "FOUND ERRORS" FAIL, a traceback CRASH), on a copy (it
  rewrites scaling.json), and its seconds;
* mlbench's: `mlbench validate --json --ruleset <ruleset> <pkg>` (PASS on exit 0, FAIL on
  1), its seconds, its warnings counted per kind, and `--strict`'s verdict (from the same
  report: no second run);
* with `--scores`, result_summarizer's time to train and samples to converge per benchmark
  against `mlbench compare`'s (on copies too: both rewrite scaling.json).

It prints one row per package as it goes and the agreement table at the end (Markdown),
and writes every row to `--out` (JSON lines) so an interrupted run resumes where it stopped.

    python benchmarks/validate_agreement.py [--mirrors /work/.mirror] [--scratch DIR]
        [--rounds v5.0 v4.1 ...] [--only SUBMITTER ...] [--scores] [--out rows.jsonl]
        [--repo PATH --python EXE]

`--repo`/`--python` pick the mlbench under test (e.g. the checkout before a change).
Run it under `nice`: it keeps one core busy for hours over all rounds.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agreement_scores import mlbench_scores, official_scores, score_agreement

HERE = Path(__file__).resolve().parent
ROUNDS = ("v0.7", "v1.0", "v1.1", "v2.0", "v2.1", "v3.0", "v3.1", "v4.0", "v4.1", "v5.0")
_PACKAGE_FILE = re.compile(r"^([^/]+)/(results|systems)/(.+)$")
_RESULT = re.compile(r"/result_\d+\.txt$")


def ruleset_of(round_name: str) -> str:
  """v4.1 -> 4.1.0: each round's results are checked under its own ruleset."""
  return round_name.lstrip("v") + ".0"


def extract(mirror: Path, dest: Path) -> dict[str, list[str]]:
  """Writes every submitter's results/ and systems/ of the mirror's HEAD under `dest`.

  Returns {submitter: [benchmark folders left out: a log is absent from the snapshot]}.
  Done once: a `.extracted` marker holding the commit makes a second call a no-op.
  """
  commit = _git(mirror, "rev-parse", "HEAD").strip()
  marker = dest / ".extracted"
  if marker.is_file() and marker.read_text().startswith(commit):
    return json.loads(marker.read_text().split("\n", 1)[1])
  if dest.exists():
    shutil.rmtree(dest)
  entries = []  # (path, blob or None when the snapshot lacks it)
  for row in _git(mirror, "ls-tree", "-r", "-l", "-z", "HEAD").split("\0"):
    if not row:
      continue
    meta, path = row.split("\t", 1)
    kind, blob, size = meta.split()[1:4]
    if kind == "blob" and _PACKAGE_FILE.match(path):
      entries.append((path, blob if size.isdigit() else None))
  # A result log the snapshot lacks takes its benchmark folder out (judged without it,
  # the folder would fail the run count); any other file is just left out.
  absent = {_folder(p) for p, blob in entries if blob is None and _RESULT.search(p)}
  left_out: dict[str, list[str]] = collections.defaultdict(list)
  for folder in sorted(absent):
    left_out[folder.split("/", 1)[0]].append(folder.split("/", 2)[2])
  wanted = [(p, b) for p, b in entries if b is not None and _folder(p) not in absent]
  _write_blobs(mirror, dest, wanted)
  marker.write_text(commit + "\n" + json.dumps(left_out))
  return dict(left_out)


def _folder(path: str) -> str:
  """The benchmark folder (`org/results/system/benchmark`) a results file lies in."""
  parts = path.split("/")
  return "/".join(parts[:4]) if parts[1] == "results" and len(parts) > 4 else path


def _write_blobs(mirror: Path, dest: Path, wanted: list[tuple[str, str]]) -> None:
  """Streams the blobs out of one `git cat-file --batch` (one process, not one per file)."""
  proc = subprocess.Popen(["git", "-C", str(mirror), "cat-file", "--batch"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE)
  try:
    for path, blob in wanted:
      proc.stdin.write(f"{blob}\n".encode())
      proc.stdin.flush()
      header = proc.stdout.readline().split()
      size = int(header[2])
      data = proc.stdout.read(size)
      proc.stdout.read(1)  # the newline after each object
      out = dest / path
      out.parent.mkdir(parents=True, exist_ok=True)
      out.write_bytes(data)
  finally:
    proc.stdin.close()
    proc.wait()


def _git(repo: Path, *args: str) -> str:
  return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                        check=True, errors="surrogateescape").stdout


def official_verdict(python: str, package: Path, ruleset: str,
                     limit_s: float) -> tuple[str, float, str]:
  """(PASS | FAIL | CRASH | HANG, seconds, the lines that decided) of the package checker,
  run on a copy of the package (it deletes and rewrites scaling.json)."""
  with tempfile.TemporaryDirectory(prefix="agree-official-") as tmp:
    copy = Path(tmp) / package.name
    shutil.copytree(package, copy)
    cmd = [python, "-m", "mlperf_logging.package_checker", str(copy), "training", ruleset,
           "--log_output", str(Path(tmp) / "checker.log")]
    t0 = time.perf_counter()
    try:
      proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit_s, cwd=tmp,
                            check=False)
    except subprocess.TimeoutExpired:
      return "HANG", time.perf_counter() - t0, f"no verdict in {limit_s:.0f} s"
    dt = time.perf_counter() - t0
  out = (proc.stdout + proc.stderr).replace(str(copy), str(package))
  if "Traceback" in out:
    return "CRASH", dt, out.strip().splitlines()[-1][:200]
  if "PACKAGE CHECKER FOUND NO ERRORS" in out:
    return "PASS", dt, ""
  errors = [ln for ln in out.splitlines() if ln.startswith("ERROR")]
  return "FAIL", dt, " | ".join(errors[:3])[:300]


def mlbench_verdict(python: str, repo: Path, package: Path, ruleset: str,
                    limit_s: float, keep: Path | None = None) -> dict:
  """mlbench validate's verdict, seconds, strict verdict and warnings per kind."""
  code = "import sys; from mlbench.cli import main; sys.exit(main())"
  env = dict(os.environ, PYTHONPATH=str(repo))
  t0 = time.perf_counter()
  try:
    proc = subprocess.run([python, "-c", code, "validate", "--json", "--ruleset", ruleset,
                           str(package)], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=limit_s, check=False)
  except subprocess.TimeoutExpired:
    return {"verdict": "HANG", "seconds": time.perf_counter() - t0}
  dt = time.perf_counter() - t0
  if "Traceback" in proc.stderr or proc.returncode not in (0, 1):
    return {"verdict": "CRASH" if "Traceback" in proc.stderr else f"EXIT {proc.returncode}",
            "seconds": dt, "why": proc.stderr.strip().splitlines()[-1][:200]
            if proc.stderr.strip() else ""}
  try:
    report = json.loads(proc.stdout)
  except ValueError:
    report = {}
  if keep is not None:
    keep.parent.mkdir(parents=True, exist_ok=True)
    keep.write_text(proc.stdout)
  return {"verdict": "PASS" if proc.returncode == 0 else "FAIL", "seconds": dt,
          "strict": report.get("strict_verdict"), "warnings": _warnings(report),
          "why": _why(report)}


def _findings(report: dict) -> list[dict]:
  out = []
  for b in report.get("benchmarks", []):
    out += b.get("findings", [])
    for f in b.get("files", []):
      out += f.get("findings", []) + f.get("checker_findings", [])
  for s in report.get("systems", []):
    out += s.get("findings", [])
  return out


def _warnings(report: dict) -> dict[str, int]:
  """Warnings per kind (the check's name), over every file, benchmark and system."""
  return dict(collections.Counter(f["check"] for f in _findings(report)
                                  if f.get("severity") == "WARN"))


def _why(report: dict) -> str:
  """The first failures of a failing report, in a line."""
  fails = [f"{f['check']}: {f['message']}" for f in _findings(report)
           if f.get("severity") == "FAIL"]
  for b in report.get("benchmarks", []):
    if b.get("verdict") == "FAIL":
      fails.insert(0, f"{b['system']}/{b['benchmark']}: {b.get('failing_runs')} failing runs")
  return " | ".join(fails[:3])[:300]


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
  ap.add_argument("--scratch", type=Path, default=Path(tempfile.gettempdir()) / "mlperf-packages")
  ap.add_argument("--rounds", nargs="*", default=list(ROUNDS))
  ap.add_argument("--only", nargs="*", default=[], metavar="SUBMITTER")
  ap.add_argument("--repo", type=Path, default=HERE.parent, help="mlbench checkout under test")
  ap.add_argument("--python", default=sys.executable, help="interpreter with its dependencies")
  ap.add_argument("--scores", action="store_true", help="also compare scores with "
                  "result_summarizer's (about doubles the time)")
  ap.add_argument("--official-from", type=Path, default=None, metavar="JSONL",
                  help="take the official verdicts and times from an earlier run's --out "
                       "(the same packages and mlperf-logging) instead of running the checker")
  ap.add_argument("--reports", type=Path, default=None, metavar="DIR",
                  help="keep mlbench's JSON report of each package here")
  ap.add_argument("--limit", type=float, default=3600, help="seconds before a tool is stopped")
  ap.add_argument("--out", type=Path, default=None, help="JSON lines, one per package; "
                  "packages already in it are not run again")
  args = ap.parse_args()
  repo = args.repo.resolve()
  done = _load(args.out)
  recorded = _load(args.official_from)
  rows = []
  for rnd in args.rounds:
    mirror = args.mirrors / f"mlcommons+training_results_{rnd}" / "repo"
    if not mirror.is_dir():
      print(f"{rnd}: no mirror at {mirror}; fetch github:mlcommons/training_results_{rnd}")
      continue
    left_out = extract(mirror, args.scratch / rnd)
    for package in sorted(p for p in (args.scratch / rnd).iterdir() if p.is_dir()):
      if args.only and package.name not in args.only:
        continue
      key = f"{rnd}/{package.name}"
      row = done.get(key)
      if row is None or (args.scores and "scores" not in row):
        row = _run(rnd, package, left_out.get(package.name, []), args, repo, row,
                   recorded.get(key))
        _save(args.out, row)
      rows.append(row)
      _print_row(row)
  print()
  print(table(rows))


def _run(rnd: str, package: Path, left_out: list[str], args: argparse.Namespace,
         repo: Path, done: dict | None, recorded: dict | None) -> dict:
  """One package's row: the verdicts (those already in `done` kept; the official ones
  of `recorded` taken), then with --scores the scores."""
  ruleset = ruleset_of(rnd)
  row = done or {"package": f"{rnd}/{package.name}", "ruleset": ruleset,
                 "left_out": left_out, "logs": len(list(package.glob("results/*/*/result_*.txt")))}
  if done is None and recorded is not None:
    row.update({k: recorded[k] for k in ("official", "official_s", "official_why")})
  if "official" not in row:
    verdict, dt, why = official_verdict(args.python, package, ruleset, args.limit)
    row.update(official=verdict, official_s=round(dt, 1), official_why=why)
  if "mlbench" not in row:
    ours = mlbench_verdict(args.python, repo, package, ruleset, args.limit, args.reports and
                           args.reports / f"{rnd}-{package.name}.json")
    row.update(mlbench=ours["verdict"], mlbench_s=round(ours["seconds"], 1),
               strict=ours.get("strict"), warnings=ours.get("warnings", {}),
               mlbench_why=ours.get("why", ""))
  if args.scores and "scores" not in row:
    o = official_scores(args.python, package, ruleset, args.limit)
    m = mlbench_scores(args.python, repo, package, ruleset, args.limit)
    compared, equal, diffs = score_agreement(o, m)
    row["scores"] = {"compared": compared, "equal": equal, "diffs": diffs[:5],
                     "summarizer_s": round(o.get("seconds", 0), 1),
                     "compare_s": round(m.get("seconds", 0), 1)}
  return row


def _load(out: Path | None) -> dict[str, dict]:
  if out is None or not out.is_file():
    return {}
  rows = [json.loads(ln) for ln in out.read_text().splitlines() if ln.strip()]
  return {r["package"]: r for r in rows}


def _save(out: Path | None, row: dict) -> None:
  if out is not None:
    with open(out, "a") as f:
      f.write(json.dumps(row) + "\n")


def agree(row: dict) -> bool:
  """Both pass, or neither does: a package the official checker crashes on (no verdict,
  so no SUCCESS) is not accepted by it, and should not be by mlbench."""
  return (row["official"] == "PASS") == (row["mlbench"] == "PASS")


def _print_row(row: dict) -> None:
  same = "==" if agree(row) else "!="
  print(f"{row['package']:32s} {row['logs']:5d} logs  official {row['official']:5s} "
        f"{row['official_s']:7.1f} s {same} mlbench {row['mlbench']:5s} {row['mlbench_s']:7.1f} s"
        f"  warn {sum(row['warnings'].values()):4d}"
        + (f"  scores {row['scores']['equal']}/{row['scores']['compared']}"
           if "scores" in row else "")
        + (f"\n    official: {row['official_why']}" if row["official"] != "PASS" else "")
        + (f"\n    mlbench:  {row['mlbench_why']}" if row["mlbench"] != "PASS" else ""),
        flush=True)


def table(rows: list[dict]) -> str:
  """The agreement table: one line per package, then a line per round."""
  kinds = sorted({k for r in rows for k in r["warnings"]})
  head = ["package", "logs", "official", "s", "mlbench", "s", "strict", *kinds]
  if any("scores" in r for r in rows):
    head.append("scores equal")
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in rows:
    cells = [r["package"] + (f" ({len(r['left_out'])} left out)" if r["left_out"] else ""),
             str(r["logs"]), r["official"], f"{r['official_s']:.1f}", r["mlbench"],
             f"{r['mlbench_s']:.1f}", str(r.get("strict") or "-"),
             *[str(r["warnings"].get(k, "")) for k in kinds]]
    if "scores" in r:
      cells.append(f"{r['scores']['equal']}/{r['scores']['compared']}")
    lines.append("| " + " | ".join(cells) + " |")
  lines.append("")
  by_round = collections.defaultdict(list)
  for r in rows:
    by_round[r["package"].split("/")[0]].append(r)
  lines.append("| round | packages | logs | official PASS / FAIL / CRASH | verdicts equal | "
               "official s | mlbench s | mlbench faster on | "
               + " | ".join(f"WARN {k}" for k in kinds) + " |")
  lines.append("|---" * (8 + len(kinds)) + "|")
  for rnd, rs in by_round.items():
    equal = sum(agree(r) for r in rs)
    faster = sum(r["mlbench_s"] <= r["official_s"] for r in rs)
    verdicts = collections.Counter(r["official"] for r in rs)
    warned = collections.Counter()
    for r in rs:
      warned.update(r["warnings"])
    lines.append(f"| {rnd} | {len(rs)} | {sum(r['logs'] for r in rs)} | {verdicts['PASS']} / "
                 f"{verdicts['FAIL']} / {verdicts['CRASH']} | {equal} | "
                 f"{sum(r['official_s'] for r in rs):.0f} | {sum(r['mlbench_s'] for r in rs):.0f}"
                 f" | {faster} | " + " | ".join(str(warned.get(k, "")) for k in kinds) + " |")
  return "\n".join(lines)


if __name__ == "__main__":
  main()
