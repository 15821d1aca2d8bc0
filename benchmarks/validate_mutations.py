"""`mlbench validate` on 250 mutated copies of the real result logs: time to a verdict.

Builds, in a temporary folder, copies of the published packages in
tests/data/mlperf-results (three copies, laid out as a folder of packages) and
mutates 250 of their logs in ways real logs break: over-long lines (one 2 MB
value, many 40 KB ones), broken JSON, a `:::MLLOG` line without a key the
official parser reads, a non-object line, deep nesting, events dropped,
duplicated, swapped or reversed, a file cut short, NUL bytes. Then it runs
`mlbench validate --json` on every mutated file, one `mlbench` process each, as
a user would, and on the whole folder, serially (`--jobs 1`) and in parallel.
It prints the slowest files, any file without a verdict in 20 s or with a
traceback, and the package times.

    python benchmarks/validate_mutations.py [--repo PATH] [--python EXE] [--count 250]

`--repo` and `--python` pick the mlbench under test (e.g. `--repo /work/main
--python /work/venv/bin/python` for the code before a change); the mutations
come from this script's own copy of the logs and `--seed`, so they are the same
for every repo.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOKEN = ":::MLLOG "
GOAL_S = 20.0


def _mllog(i: int, lines: list[str]) -> int:
  """Index of the i-th `:::MLLOG` line (modulo their count)."""
  idx = [n for n, ln in enumerate(lines) if TOKEN in ln]
  return idx[i % len(idx)]


def _event(key: str, value: object) -> str:
  return TOKEN + json.dumps({"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME",
                             "key": key, "value": value, "metadata": {}}) + "\n"


def _long_value(lines, rng):  # the case of issue 22: one extra line with a 2 MB string
  n = _mllog(rng.randrange(1000), lines)
  return lines[:n] + [_event("note", "x" * 2_000_000)] + lines[n:]


def _many_long(lines, rng):  # each line short enough; together too slow for the regex
  extra = [_event(f"note_{i}", "y" * 40_000) for i in range(60)]
  return lines[:3] + extra + lines[3:]


def _long_garbage(lines, rng):  # a 300 KB :::MLLOG line that is not JSON
  n = _mllog(rng.randrange(1000), lines)
  return lines[:n] + [TOKEN + "{" + "garbage " * 40_000 + "\n"] + lines[n:]


def _long_text(lines, rng):  # a 2 MB line of program output, no :::MLLOG in it
  return lines[:5] + ["W" * 2_000_000 + "\n"] + lines[5:]


def _broken_json(lines, rng):
  n = _mllog(rng.randrange(1000), lines)
  text = lines[n].rstrip("\n")
  cut = rng.randrange(len(text) // 2, len(text) - 1)
  return lines[:n] + [text[:cut] + "\n"] + lines[n + 1:]


def _missing_key(lines, rng):  # the official parser raises KeyError on these
  n = _mllog(rng.randrange(1000), lines)
  head, body = lines[n].split(TOKEN, 1)
  try:
    d = json.loads(body)
  except ValueError:
    return _broken_json(lines, rng)
  d.pop(rng.choice(["time_ms", "key", "value", "metadata"]), None)
  return lines[:n] + [head + TOKEN + json.dumps(d) + "\n"] + lines[n + 1:]


def _not_an_object(lines, rng):
  n = _mllog(rng.randrange(1000), lines)
  return lines[:n] + [TOKEN + rng.choice(["[1, 2, 3]", "42", '"text"', "null"]) + "\n"] + lines[n:]


def _deep(lines, rng):  # nesting no JSON parser recurses through
  return lines[:4] + [TOKEN + "[" * 200_000 + "]" * 200_000 + "\n"] + lines[4:]


def _drop_key(lines, rng):
  key = rng.choice(["run_stop", "init_start", "run_start", "global_batch_size", "seed",
                    "eval_accuracy", "submission_benchmark", "opt_base_learning_rate"])
  return [ln for ln in lines if f'"key": "{key}"' not in ln]


def _duplicate(lines, rng):
  n = _mllog(rng.randrange(1000), lines)
  return lines[:n] + [lines[n]] * 3 + lines[n:]


def _swap(lines, rng):
  a, b = _mllog(rng.randrange(1000), lines), _mllog(rng.randrange(1000), lines)
  out = list(lines)
  out[a], out[b] = out[b], out[a]
  return out


def _reverse(lines, rng):
  return list(reversed(lines))


def _truncate(lines, rng):
  text = "".join(lines)
  return [text[:rng.randrange(len(text) // 10, len(text))]]


def _nul_bytes(lines, rng):
  n = _mllog(rng.randrange(1000), lines)
  return lines[:n] + [lines[n][:20] + "\x00" * 50 + lines[n][20:]] + lines[n + 1:]


# (mutation, weight): the stalling kinds are rare, as in the issue's own set (10 of 250).
MUTATIONS: list[tuple[Callable, int]] = [
    (_long_value, 1), (_many_long, 1), (_long_garbage, 1), (_long_text, 2), (_deep, 2),
    (_broken_json, 6), (_missing_key, 6), (_not_an_object, 3), (_drop_key, 8), (_duplicate, 4),
    (_swap, 6), (_reverse, 2), (_truncate, 6), (_nul_bytes, 3)]


def build(source: Path, root: Path, count: int, seed: int,
          exclude: tuple[str, ...] = ()) -> list[tuple[Path, str]]:
  """Copies the packages under `root` and mutates `count` logs; returns (file, mutation)."""
  packages = sorted(p.parent for p in source.glob("*/*/results"))
  copies = 0
  logs: list[Path] = []
  while len(logs) < count:
    for pkg in packages:
      dest = root / f"c{copies}-{pkg.parent.name}-{pkg.name}"
      shutil.copytree(pkg, dest)
      logs += sorted(dest.glob("results/*/*/result_*.txt"))
    copies += 1
  rng = random.Random(seed)
  kinds = [m for m, w in MUTATIONS for _ in range(w) if m.__name__.lstrip("_") not in exclude]
  out = []
  for path in rng.sample(logs, count):
    mutate = rng.choice(kinds)
    with open(path, encoding="latin-1", newline="") as f:
      lines = f.readlines()
    with open(path, "w", encoding="latin-1", newline="") as f:
      f.write("".join(mutate(lines, rng)))
    out.append((path, mutate.__name__.lstrip("_")))
  return out


def validate(python: str, repo: Path, args: list[str],
             limit_s: float) -> tuple[float, str, int, str]:
  """Runs `mlbench validate --json ARGS` -> (seconds, outcome, exit code, stdout)."""
  code = "import sys; from mlbench.cli import main; sys.exit(main())"
  env = dict(os.environ, PYTHONPATH=str(repo))
  t0 = time.perf_counter()
  try:
    proc = subprocess.run([python, "-c", code, "validate", "--json", *args], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=limit_s, check=False)
  except subprocess.TimeoutExpired:
    return time.perf_counter() - t0, f"no verdict in {limit_s:.0f} s", -1, ""
  dt = time.perf_counter() - t0
  if "Traceback" in proc.stderr:
    return (dt, "traceback: " + proc.stderr.strip().splitlines()[-1][:120], proc.returncode,
            proc.stdout)
  if proc.returncode not in (0, 1):
    return dt, "error: " + proc.stderr.strip()[-120:], proc.returncode, proc.stdout
  return dt, "verdict " + ("PASS" if proc.returncode == 0 else "FAIL"), proc.returncode, proc.stdout


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--repo", type=Path, default=HERE.parent, help="mlbench checkout under test")
  ap.add_argument("--python", default=sys.executable, help="interpreter with its dependencies")
  ap.add_argument("--source", type=Path, default=HERE.parent / "tests/data/mlperf-results")
  ap.add_argument("--count", type=int, default=250)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--exclude", nargs="*", default=[], metavar="KIND",
                  help="mutations to leave out (e.g. deep: one such log makes the code before "
                       "this script fail on every log of its package)")
  ap.add_argument("--limit", type=float, default=600, help="seconds before a run is stopped")
  ap.add_argument("--skip-files", action="store_true", help="time the package runs only")
  ap.add_argument("--skip-package", action="store_true", help="time the file runs only")
  args = ap.parse_args()

  repo = args.repo.resolve()
  with tempfile.TemporaryDirectory(prefix="mutations-") as tmp:
    mutated = build(args.source.resolve(), Path(tmp), args.count, args.seed, tuple(args.exclude))
    print(f"{len(mutated)} mutated logs under {tmp}; mlbench from {repo}", flush=True)
    if not args.skip_files:
      _files(mutated, args, repo)
    if not args.skip_package:
      _package(Path(tmp), args, repo)


def _files(mutated: list[tuple[Path, str]], args: argparse.Namespace, repo: Path) -> None:
  times = []
  for n, (path, kind) in enumerate(mutated):
    dt, outcome, _, _ = validate(args.python, repo, [str(path)], args.limit)
    times.append((dt, kind, path, outcome))
    if dt > GOAL_S or not outcome.startswith("verdict"):
      print(f"  [{n + 1}/{len(mutated)}] {dt:6.1f} s {kind:14s} {outcome}  {path.name}",
            flush=True)
  times.sort(key=lambda x: x[0], reverse=True)
  print("slowest files:")
  for dt, kind, path, outcome in times[:5]:
    print(f"  {dt:6.1f} s  {kind:14s} {outcome}  {path.parent.parent.name}/"
          f"{path.parent.name}/{path.name}")
  bad = [t for t in times if t[0] > GOAL_S or not t[3].startswith("verdict")]
  total = sum(t[0] for t in times)
  print(f"RESULT files: slowest {times[0][0]:.1f} s ({times[0][1]}), {len(bad)} of {len(times)} "
        f"without a verdict in {GOAL_S:.0f} s or with a traceback, {total:.0f} s in all",
        flush=True)


def _package(root: Path, args: argparse.Namespace, repo: Path) -> None:
  code = "import sys; from mlbench.cli import main; sys.exit(main())"
  help_text = subprocess.run([args.python, "-c", code, "validate", "--help"], cwd=repo,
                             env=dict(os.environ, PYTHONPATH=str(repo)),
                             capture_output=True, text=True, check=False).stdout
  variants = ([("serial", ["--jobs", "1"]), ("parallel", [])] if "--jobs" in help_text
              else [("default", [])])
  verdicts = {}
  for name, extra in variants:
    dt, outcome, code, out = validate(args.python, repo, [*extra, str(root)], args.limit * 10)
    verdicts[name] = _verdicts(out)
    print(f"RESULT package ({name}{' ' + ' '.join(extra) if extra else ''}): {dt:.1f} s, "
          f"{outcome}, exit {code}, {len(verdicts[name])} files judged", flush=True)
  if len(verdicts) == 2:
    serial, parallel = verdicts.values()
    differ = sorted(p for p in serial.keys() | parallel.keys() if serial.get(p) != parallel.get(p))
    print(f"RESULT serial and parallel verdicts: {'the same' if not differ else 'differ'} "
          f"({len(differ)} files differ{': ' + ', '.join(differ[:5]) if differ else ''})")


def _verdicts(stdout: str) -> dict[str, tuple[str, str]]:
  """(checker, verdict) per file of a package report."""
  try:
    report = json.loads(stdout)
  except ValueError:
    return {}
  return {f["path"]: (f["checker"], f["verdict"]) for b in report["benchmarks"]
          for f in b["files"]}


if __name__ == "__main__":
  main()
