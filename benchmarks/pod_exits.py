"""How every process of a two-process run exits: repeated short runs, fresh and resumed.

A scheduler judges a pod's job by every process's exit code (SLURM's --kill-on-bad-exit, a
JobSet, a TPU VM's startup script): a run must end with the same code on every process,
0 where it reached its target. Each repetition starts `mlbench run resnet50` as two
jax.distributed processes on 127.0.0.1 (2 simulated CPU devices each) and records each
process's exit code and the tail of its stderr:

    fresh    one run to its end
    resumed  a run stopped by SIGTERM on both processes (as `scancel` does) after its first
             checkpoint, then `--resume` on both to its end

The default run is one epoch (19 steps), which ends on its budget below the mini target:
every process must exit 1 (stopped: 143 = 128 + SIGTERM). `--epochs 8 --seed 3` reaches
the target (every process 0), at about three times the cost. PYTHONFAULTHANDLER is set,
so a process that aborts prints every thread's Python stack.

`--stress N` measures the shutdown itself, side by side: N two-process jax.distributed jobs
whose processes each run mlbench's peer watch with a heartbeat every millisecond (so its
thread is inside jax's client most of the time) and end a second apart, either falling off
the end of the program as `mlbench` did before (`atexit`: jax's exit handler shuts
jax.distributed down while the watch still runs) or through `runtime.leave` (`leave`).

    python benchmarks/pod_exits.py --runs 24 --out before.jsonl [--epochs 1]
    python benchmarks/pod_exits.py --summarize before.jsonl after.jsonl
    python benchmarks/pod_exits.py --stress 20
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MLBENCH = (sys.executable, "-c", "import sys; from mlbench.cli import main; sys.exit(main())")
TIMEOUT_S = 900.0


def _port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _start(argv: list[str], folder: Path, tag: str,
           argv_for=None) -> list[tuple[subprocess.Popen, Path]]:
  """The two processes of one jax.distributed job: `mlbench` with `argv`, or `argv_for(i,
  port)`."""
  port, procs = _port(), []
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env |= {"PYTHONFAULTHANDLER": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "JAX_PLATFORMS": "cpu"}
  for i in range(2):
    err = folder / f"{tag}.{i}.err"
    with open(folder / f"{tag}.{i}.out", "w") as out, open(err, "w") as e:
      procs.append((subprocess.Popen(
          argv_for(i, port) if argv_for else [
              *MLBENCH, *argv, "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
              "--process-id", str(i)], stdout=out, stderr=e, env=env, cwd=folder,
          start_new_session=True), err))
  return procs


def _wait(procs: list[tuple[subprocess.Popen, Path]]) -> list[dict]:
  """Each process's exit code (None: killed at the timeout) and the end of its stderr."""
  deadline, got = time.monotonic() + TIMEOUT_S, []
  for p, err in procs:
    try:
      p.wait(max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      os.killpg(p.pid, signal.SIGKILL)
      p.wait()
      got.append({"code": None, "tail": _tail(err)})
      continue
    got.append({"code": p.returncode, "tail": _tail(err)})
  return got


def _tail(err: Path) -> str:
  """The end of a process's stderr, without faulthandler's list of extension modules."""
  lines = err.read_text(errors="replace").splitlines()
  return "\n".join(ln for ln in lines if not ln.startswith("Extension modules:"))[-3000:]


def _first_checkpoint(folder: Path, procs: list[tuple[subprocess.Popen, Path]],
                      step: int) -> Path | None:
  """The run's checkpoint folder once the save of `step` committed (None: it ended first)."""
  deadline = time.monotonic() + TIMEOUT_S
  while time.monotonic() < deadline and all(p.poll() is None for p, _ in procs):
    found = list(folder.glob(f"results/runs/*/resnet/*/checkpoints/{step}/commit_success.txt"))
    if found:
      return found[0].parents[1]
    time.sleep(0.2)
  return None


def one(kind: str, folder: Path, args: argparse.Namespace) -> dict:
  """One repetition: its phases, each with every process's exit code and the code
  expected of it."""
  folder.mkdir(parents=True)
  expect = 0 if args.epochs >= 8 else 1
  argv = ["run", "resnet50", "--cpu-devices", "2", "--data-dir", str(args.data_dir),
          "--seed", str(args.seed), "--set", f"train_epochs={args.epochs}", "--system",
          "cpu-2proc", "--results-dir", str(folder / "results"), "--compile-cache",
          str(args.compile_cache), "--checkpoint-every", str(args.every)]
  procs = _start(argv, folder, "run")
  phases = []
  if kind == "resumed":
    ckpt = _first_checkpoint(folder, procs, args.every)
    if ckpt is not None:
      for p, _ in procs:
        p.send_signal(signal.SIGTERM)
      phases.append({"phase": "stopped", "expect": 128 + signal.SIGTERM,
                     "processes": _wait(procs)})
      procs = _start(["run", "resnet50", "--resume", str(ckpt), "--cpu-devices", "2",
                      "--data-dir", str(args.data_dir), "--compile-cache",
                      str(args.compile_cache)], folder, "resume")
  phases.append({"phase": "resumed" if len(phases) else "run", "expect": expect,
                 "processes": _wait(procs)})
  return {"kind": kind, "phases": phases}


def verdict(phase: dict) -> str:
  """ok: every process exited with the expected code; same: with one other code alike;
  else what differed."""
  codes = [p["code"] for p in phase["processes"]]
  if all(c == phase["expect"] for c in codes):
    return "ok"
  if any(c is not None and c < 0 or c == 134 for c in codes):
    return "abort"
  return "same" if len(set(codes)) == 1 else "differ"


def summarize(files: list[Path]) -> None:
  """A table per file: phases by verdict, and every process's code of the others."""
  for path in files:
    runs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    counts = collections.Counter()
    odd = []
    for r in runs:
      for ph in r["phases"]:
        v = verdict(ph)
        counts[v] += 1
        if v != "ok":
          odd.append((r["kind"], ph["phase"], [p["code"] for p in ph["processes"]],
                      _last_line(ph["processes"])))
    procs = sum(len(ph["processes"]) for r in runs for ph in r["phases"])
    kinds = collections.Counter(r["kind"] for r in runs)
    print(f"{path}: {len(runs)} runs ({dict(kinds)}), {procs} process exits; phases "
          f"{dict(counts)}")
    for kind, phase, codes, last in odd:
      print(f"  {kind}/{phase}: codes {codes}: {last}")


def _last_line(processes: list[dict]) -> str:
  """The most telling line of the processes' stderr tails (an abort's, else the last)."""
  for p in processes:
    for line in p["tail"].splitlines():
      if "FATAL" in line or "terminate called" in line or line.startswith("error:"):
        return line[:160]
  return processes[-1]["tail"].strip().splitlines()[-1][:160] if processes[-1]["tail"] else ""


def child(mode: str, coordinator: str, process: int) -> None:
  """One process of a `--stress` job (see the module docstring)."""
  from mlbench.train import runtime
  from mlbench.train.lifecycle import peers

  runtime.setup(cpu_devices=1, distributed=runtime.Distributed(coordinator, 2, process))
  peers.INTERVAL_S = 0.001
  peers.watch(process, 2)
  time.sleep(1.0 + process)  # process 1 ends later, as process 0's filing keeps it later
  if mode == "leave":
    sys.exit(runtime.leave(0, finished=True))


def stress(n: int, work: Path) -> None:
  """`--stress`: n jobs of each mode, alternating; every process's exit code per mode."""
  codes: dict[str, collections.Counter] = {"atexit": collections.Counter(),
                                           "leave": collections.Counter()}
  for i in range(n):
    for mode in codes:
      folder = work / f"stress-{i:03d}-{mode}"
      folder.mkdir(parents=True)
      procs = _start([], folder, mode, argv_for=lambda p, port: [
          sys.executable, __file__, "--child", mode, f"127.0.0.1:{port}", str(p)])
      got = [p["code"] for p in _wait(procs)]
      codes[mode].update(got)
      print(f"{i + 1}/{n} {mode}: {got}", flush=True)
  for mode, counted in codes.items():
    print(f"RESULT {mode}: {sum(counted.values())} process exits, codes {dict(counted)}")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--runs", type=int, default=24, help="repetitions, alternating the kinds")
  ap.add_argument("--kinds", default="fresh,resumed")
  ap.add_argument("--epochs", type=float, default=1)
  ap.add_argument("--seed", type=int, default=3)
  ap.add_argument("--every", type=int, default=4, help="--checkpoint-every")
  ap.add_argument("--data-dir", type=Path, help="[default: generated under --work]")
  ap.add_argument("--work", type=Path, help="[default: a temporary folder]")
  ap.add_argument("--out", type=Path, help="append one JSON line per run here")
  ap.add_argument("--summarize", nargs="+", type=Path, metavar="JSONL")
  ap.add_argument("--stress", type=int, metavar="N", help="N shutdown-only jobs per mode")
  ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.child:
    return child(args.child[0], args.child[1], int(args.child[2]))
  if args.summarize:
    return summarize(args.summarize)
  args.work = args.work or Path(tempfile.mkdtemp(prefix="pod-exits-"))
  if args.stress:
    return stress(args.stress, args.work)
  args.compile_cache = args.work / "jax-cache"
  if args.data_dir is None:
    from mlbench import registry

    w = registry.get("resnet50")
    args.data_dir = args.work / "data"
    w.input.prepare(w.configs["mini"](), args.data_dir)
  out = args.out or args.work / "exits.jsonl"
  kinds = args.kinds.split(",")
  for i in range(args.runs):
    kind = kinds[i % len(kinds)]
    t0 = time.time()
    record = one(kind, args.work / f"{i:03d}-{kind}", args) | {"seconds": round(time.time() - t0)}
    with open(out, "a") as f:
      f.write(json.dumps(record) + "\n")
    print(f"{i + 1}/{args.runs} {kind}: " + "; ".join(
        f"{ph['phase']} {[p['code'] for p in ph['processes']]} ({verdict(ph)})"
        for ph in record["phases"]) + f" in {record['seconds']} s", flush=True)
  summarize([out])


if __name__ == "__main__":
  main()
