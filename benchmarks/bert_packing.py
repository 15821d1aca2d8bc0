"""Packed BERT against padded BERT (issue 47), side by side in one run.

Parts (`--part`, repeatable; default lengths and cpu):
- lengths: per length distribution (the mini's records, read back; the reference procedure
  at 512 over pydoc, the only real English corpus here; MLPerf's Wikipedia lengths as the
  packing paper publishes them, bert_wikipedia_lengths.json), its padding share, the packing
  factor it allows, and the online packer (workloads/bert/packing.py) on `--steps` simulated
  steps of 64 and 192 sequences a host: steps it could not fill, sequences that waited; the
  packer at 3, 4, 6 and 8 sequences a row; its speed (sequences/s, one core, rows built).
- cpu: the mini's train step (one device), padded (64 rows) and packed (its 64 sequences in
  63 rows), real batches of its data, alternating rounds: sequences/s; `--ttt` also runs
  `mlbench run bert` to its target once each way.
- tpu: `mlbench check bert --config full --topology v4-128 --set global_batch_size=3072`,
  packed and `data.max_sequences_per_row=1` (libtpu; tens of minutes each here): FLOPs per
  sequence, rows, XLA's step estimate (corrected as check does) and its sequences/s, the
  predicted step, sequences/s, time to train. Goals: packed >= 1.8x, time to train >= 1.6x.
- gpu: BERT-large bf16 on one GPU at 32 sequences, packed and padded, alternating rounds,
  and the compiled HF peer (padded); "no GPU lent" where there is none.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
MLBENCH = [sys.executable, "-c", "import sys; from mlbench.cli import main; sys.exit(main())"]
PADDED = ("data.max_sequences_per_row=1",)


def _folder(data_dir: str | None):
  from mlbench.storage import paths

  return paths.path(data_dir) if data_dir else paths.default_cache_dir() / "data"


def mini_lengths(data_dir: str | None) -> tuple[np.ndarray, int]:
  """Lengths of the mini's training records, read by its own reader."""
  from mlbench.train import data
  from mlbench.workload import Split
  from workloads.bert import config, input_pipeline, pydoc

  cfg = config.mini()
  pydoc.prepare(cfg, _folder(data_dir))
  files = input_pipeline.files(cfg, _folder(data_dir), Split.TRAIN)
  ds = data.tf().data.TFRecordDataset(files).map(
      lambda r: input_pipeline.decode(cfg, Split.TRAIN)(r, None)["input_mask"])
  lengths = [int(m.sum()) for m in ds.as_numpy_iterator()]
  return np.bincount(lengths, minlength=65)[1:], cfg.data.max_seq_length


def pydoc_lengths_at_512() -> tuple[np.ndarray, int]:
  """Lengths of the reference procedure's examples at 512 tokens over pydoc's training
  topics (one pass, the mini's vocabulary size and seed)."""
  from workloads.bert import config, pretraining_data as ptd, pydoc

  train, _ = pydoc.topics()
  tokenizer = pydoc.train_tokenizer(["\n".join(d) for d in train], config.mini().model.vocab_size)
  vocab = tokenizer.get_vocab()
  docs = pydoc.documents(tokenizer, train)
  examples = ptd.examples(docs, {t: vocab[t] for t in ptd.SPECIAL}, len(vocab),
                          ptd.Masking(512, 76), dupe_factor=1, seed=pydoc.SEEDS["train"])
  return np.bincount([int(e["input_mask"].sum()) for e in examples], minlength=513)[1:], 512


def wikipedia_lengths() -> tuple[np.ndarray, int]:
  doc = json.loads((HERE / "bert_wikipedia_lengths.json").read_text())
  return np.array(doc["counts"], np.int64), int(doc["max_seq_length"])


def simulate(hist: np.ndarray, length: int, predictions: int, *, examples: int, steps: int,
             per_row: int = 8, factor: float = 1.95, seed: int = 0) -> dict:
  """The packer's choices (`packing.select`) on `steps` steps of lengths drawn from `hist`."""
  from mlbench.errors import UserError
  from workloads.bert import packing

  rng = np.random.default_rng(seed)
  shape = packing.RowShape(length, per_row, packing.row_predictions(predictions, per_row, length))
  rows = int(np.ceil(examples / factor))
  lookahead = max(examples, 256)
  queue = np.zeros((0, 3), np.int64)  # length, masked tokens, index in the stream
  failed, waits, spent, read = 0, [], 0.0, 0
  for step in range(steps):
    new = rng.choice(np.arange(1, length + 1), examples + lookahead - len(queue),
                     p=hist / hist.sum())
    masked = np.minimum(predictions, np.maximum(1, np.round(0.15 * new)))
    index = np.arange(read, read + len(new))
    read += len(new)
    queue = np.concatenate([queue, np.stack([new, masked, index], 1).astype(np.int64)])
    late = step - queue[:, 2] // examples  # steps behind its place, as the Packer counts
    t0 = time.perf_counter()
    try:
      chosen, _, _ = packing.select(queue[:, 0], queue[:, 1], late, examples=examples,
                                    rows=rows, shape=shape)
    except UserError:
      failed, chosen = failed + 1, np.arange(examples)
    spent += time.perf_counter() - t0
    waits += np.maximum(late[chosen], 0).tolist()
    queue = queue[np.flatnonzero(~np.isin(np.arange(len(queue)), chosen))]
  waits_a = np.array(waits)
  return {"examples": examples, "rows": rows, "failed_steps": failed, "steps": steps,
          "waited": float((waits_a > 0).mean()), "max_wait": int(waits_a.max()),
          "at_bound": float((waits_a == packing.MAX_DEFERRALS).mean()),
          "select_ms": 1e3 * spent / steps}


def packer_rate(hist: np.ndarray, length: int, examples: int = 192, steps: int = 30) -> float:
  """Sequences/s of the whole packer (choice and rows built), one core, BERT-large's rows."""
  from mlbench import config as config_lib
  from workloads.bert import config, input_pipeline

  cfg = config_lib.override(config.full(), [f"data.max_seq_length={length}"])
  rng = np.random.default_rng(1)
  lengths = rng.choice(np.arange(1, length + 1), examples * (steps + 2), p=hist / hist.sum())
  lengths = np.maximum(lengths, 4)
  masked = np.minimum(76, np.maximum(1, np.round(0.15 * lengths))).astype(np.int64)
  records = input_pipeline._examples(cfg, lengths, masked, rng)
  chunks = [{k: np.stack([r[k] for r in records[i:i + 64]]) for k in records[0]}
            for i in range(0, len(records), 64)]
  packer = input_pipeline.pack(cfg, examples, int(np.ceil(examples / 1.95)))
  batches = packer(iter(chunks))
  next(batches)
  t0 = time.perf_counter()
  for _ in range(steps):
    next(batches)
  return examples * steps / (time.perf_counter() - t0)


def per_row_sweep(hist: np.ndarray, length: int, steps: int) -> None:
  """By sequences a row: best fit's factor over 192, the packer at v4-128's 100 rows for 192."""
  from workloads.bert import packing

  rng = np.random.default_rng(2)
  print("| Wikipedia, at most a row | best fit over 192 | failed, 192 in 100 rows | waited |\n"
        "|---|---|---|---|")
  for most in (3, 4, 6, 8):
    shape = packing.RowShape(length, most, packing.row_predictions(76, most, length))
    factors = []
    for _ in range(20):
      n = rng.choice(np.arange(1, length + 1), 192, p=hist / hist.sum())
      masked = np.minimum(76, np.maximum(1, np.round(0.15 * n))).astype(np.int64)
      factors.append(192 / packing.best_fit_decreasing(n, masked, shape)[2])
    r = simulate(hist, length, 76, examples=192, steps=steps, per_row=most, factor=1.92)
    print(f"| {most} | {np.mean(factors):.3f} | {r['failed_steps']} of {r['steps']} | "
          f"{100 * r['waited']:.2f}% |", flush=True)


def lengths_part(args) -> None:
  """Each distribution's padding and the packer on it, sized at the full config's 1.95 or,
  where the data allows less, at 97.5% of what it allows."""
  print("| data | max_seq_length | sequences | padding share | packing factor allowed | "
        "sized at | per host | rows | steps failed | waited | max wait | waited 4 | select ms |\n"
        + "|---" * 13 + "|")
  for name, (hist, length), predictions in (
      ("mini (pydoc, its records)", mini_lengths(args.data_dir), 10),
      ("pydoc, reference procedure at 512", pydoc_lengths_at_512(), 76),
      ("MLPerf Wikipedia (Krell et al.)", wikipedia_lengths(), 76)):
    mean = (hist * np.arange(1, length + 1)).sum() / hist.sum()
    factor = min(1.95, round(0.975 * length / mean, 2))
    for examples in (64, 192):
      r = simulate(hist, length, predictions, examples=examples, steps=args.steps,
                   factor=factor)
      print(f"| {name} | {length} | {hist.sum():,} | {100 * (1 - mean / length):.1f}% | "
            f"{length / mean:.3f} | {factor} | {examples} | {r['rows']} | "
            f"{r['failed_steps']} of {r['steps']} | {100 * r['waited']:.2f}% | "
            f"{r['max_wait']} | {100 * r['at_bound']:.2f}% | {r['select_ms']:.1f} |", flush=True)
  per_row_sweep(*wikipedia_lengths(), steps=args.steps)
  rate = packer_rate(*wikipedia_lengths())
  print(f"packer, whole (choice and BERT-large rows built), Wikipedia lengths, 192 a step: "
        f"{rate:,.0f} sequences/s on one core", flush=True)


MINI_PACKED = ("data.max_sequences_per_row=3", "data.packing_factor=1.02")


def _compiled_step(cfg, batches: list, devices: list):
  """(run(n) -> sequences, rows): `cfg`'s train step on `devices`, n steps over `batches`."""
  import jax

  from mlbench.train import mesh as mesh_lib, steps
  from mlbench.workload import StepContext
  from workloads.bert import WORKLOAD

  sched = WORKLOAD.schedule(cfg)
  mesh = mesh_lib.make_mesh({"data": len(devices)}, devices=devices)
  p = steps.compile_programs(WORKLOAD, cfg, sched, mesh, StepContext(mesh=mesh),
                             WORKLOAD.optimizer(cfg, sched))
  on_device = [mesh_lib.to_global(b, p.batch_sharding, sched.rows()) for b in batches]
  state = [p.init_state(0)]

  def run(n: int) -> float:
    s, sums = state[0], p.fresh_sums()
    for i in range(n):
      s, sums = p.train(s, sums, on_device[i % len(on_device)])
    jax.block_until_ready(s)
    state[0] = s
    return float(n * sched.global_batch_size)

  run(2)  # warm up
  return run, sched.rows()


def _mini_batches(cfg, data_dir: str | None, count: int) -> list:
  import itertools

  from mlbench.train import data
  from mlbench.workload import Split
  from workloads.bert import WORKLOAD, input_pipeline

  sched = WORKLOAD.schedule(cfg)
  pack = input_pipeline.pack(cfg, sched.global_batch_size, sched.rows()) if sched.packing \
      else None
  ds = data.train_dataset(input_pipeline.files(cfg, _folder(data_dir), Split.TRAIN),
                          input_pipeline.decode(cfg, Split.TRAIN),
                          per_host_batch=sched.global_batch_size, seed=0, host=0, hosts=1,
                          pack=pack)
  return list(itertools.islice(data.numpy_batches(ds), count))


def cpu_part(args) -> None:
  import jax

  from common import report, side_by_side
  from mlbench import config as config_lib
  from workloads.bert import config

  variants = {"padded": config.mini(),
              "packed": config_lib.override(config.mini(), list(MINI_PACKED))}
  runs = {}
  for name, cfg in variants.items():
    run, rows = _compiled_step(cfg, _mini_batches(cfg, args.data_dir, 8), jax.devices()[:1])
    runs[name] = lambda run=run: run(args.cpu_steps)
    print(f"mini, {name}: 64 sequences a step in {rows} rows", flush=True)
  report(side_by_side(runs, args.rounds), "sequences/s", "padded", "packed")
  if args.ttt:
    for name, sets in (("padded", ()), ("packed", MINI_PACKED)):
      print(f"mini time to target, {name}: {_time_to_target(sets)}", flush=True)


def _mlbench(*args: str, sets: tuple[str, ...] = ()) -> dict:
  """The JSON object an `mlbench` command prints last, or {"failed": its last error line}."""
  done = subprocess.run([*MLBENCH, *args, *(a for s in sets for a in ("--set", s))],
                        capture_output=True, text=True)
  if done.returncode:
    return {"failed": (done.stderr.strip().splitlines() or ["?"])[-1][:200]}
  return json.loads(done.stdout[done.stdout.rfind("\n{") + 1:])  # check's spans lines


def _time_to_target(sets: tuple[str, ...]) -> str:
  import tempfile

  with tempfile.TemporaryDirectory() as tmp:
    r = _mlbench("run", "bert", "--seed", "0", "--results-dir", tmp, sets=sets)
  return r.get("failed") or (
      f"{r['status']} in {r['time_to_train_s']:.1f} s, {r['samples']:,} samples, "
      f"{r['samples_per_s']:.1f} sequences/s, eval_accuracy {r['eval_accuracy']:.4f}")


def tpu_part(args) -> None:
  reports = {name: _mlbench("check", "bert", "--config", "full", "--topology", args.topology,
                            "--json", sets=("global_batch_size=3072", *more))
             for name, more in (("padded", PADDED), ("packed", ()))}
  if args.save:
    Path(args.save).write_text(json.dumps(reports, indent=1))
  print(f"| BERT-large, {args.topology}, batch 3,072 | rows/step | model GFLOP/sequence | XLA "
        "GFLOP/sequence | XLA's estimate | sequences/s by it | compute, HBM bound | predicted "
        "step | sequences/s | time to train | of which evaluations |\n" + "|---" * 11 + "|")
  for name, r in reports.items():
    if "failed" in r:
      print(f"| {name} | failed: {r['failed']} |")
      continue
    train, p, roof = r["programs"][0], r["prediction"], r["prediction"]["roofline"]
    s = train["xla_seconds"]  # corrected as check does (mlbench/pod/xlacost.py), or why none
    xla = (f"{1e3 * s:.1f} ms ({train['xla_concat_bitcasts']} ConcatBitcast added back) | "
           f"{r['global_batch_size'] / s:,.0f}" if s else f"- ({train['xla_note']}) | -")
    print(f"| {name} | {r['rows_per_step']:,} | {r['flops_per_example'] / 1e9:,.1f} | "
          f"{train['flops'] / r['global_batch_size'] / 1e9:,.1f} | {xla} | "
          f"{1e3 * roof['compute_s']:.1f}, {1e3 * roof['hbm_s']:.1f} ms | "
          f"{1e3 * p['step_s']:.1f} ms | {p['samples_per_s']:,.0f} | "
          f"{p['time_to_train_s'] / 60:.2f} min | {p['terms']['eval_s'] / 60:.2f} min |",
          flush=True)
  if all("failed" not in r for r in reports.values()):
    pad, packed = (reports[k]["prediction"] for k in ("padded", "packed"))
    speed = packed["samples_per_s"] / pad["samples_per_s"]
    shorter = pad["time_to_train_s"] / packed["time_to_train_s"]
    print(f"RESULT packed/padded: sequences/s {speed:.2f}x (goal >= 1.8x: "
          f"{'met' if speed >= 1.8 else 'not met'}), time to train {shorter:.2f}x shorter "
          f"(goal >= 1.6x: {'met' if shorter >= 1.6 else 'not met'}); by XLA's step estimates "
          f"{(pad['xla_step_s'] or np.nan) / (packed['xla_step_s'] or np.nan):.2f}x", flush=True)


def gpu_part(args) -> None:
  """BERT-large bf16, one GPU, 32 sequences a step: packed vs padded, and the HF peer."""
  import jax

  gpus = [d for d in jax.devices() if d.platform == "gpu"]
  if not gpus:
    print("gpu: no GPU lent (no GPU device here); run --part gpu where one is")
    return
  # The peer first, in its own process, before this one's step takes the GPU's memory.
  peer = subprocess.run([sys.executable, str(HERE / "peers.py"), "--workload", "bert",
                         "--config", "full", "--precision", "bfloat16", "--batch", "32"],
                        capture_output=True, text=True)
  print(f"HF peer (padded): {peer.stdout.strip() or peer.stderr.strip()[-300:]}", flush=True)
  from common import config_for, report, side_by_side
  from mlbench.workload import Split
  from workloads.bert import WORKLOAD

  runs = {}
  for name, sets in (("padded", PADDED), ("packed", ())):
    _, cfg = config_for("bert", "full", "bfloat16", 32, sets)
    sched = WORKLOAD.schedule(cfg)
    rng = np.random.default_rng(0)
    batches = [WORKLOAD.synthetic_batch(cfg, Split.TRAIN, sched.rows(), rng) for _ in range(2)]
    run, rows = _compiled_step(cfg, batches, gpus[:1])
    runs[name] = lambda run=run: run(args.gpu_steps)
    print(f"{gpus[0].device_kind}, {name}: 32 sequences a step in {rows} rows", flush=True)
  report(side_by_side(runs, args.rounds), "sequences/s", "padded", "packed")


PARTS = {"lengths": lengths_part, "cpu": cpu_part, "tpu": tpu_part, "gpu": gpu_part}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--part", action="append", choices=list(PARTS),
                  help="repeatable [default: lengths and cpu]")
  ap.add_argument("--data-dir", help="where the mini data is (generated there if absent) "
                                     "[default: mlbench's cache]")
  ap.add_argument("--steps", type=int, default=2000, help="simulated packer steps")
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--cpu-steps", type=int, default=20, help="train steps per round (cpu)")
  ap.add_argument("--gpu-steps", type=int, default=50, help="train steps per round (gpu)")
  ap.add_argument("--ttt", action="store_true", help="cpu: also the mini's time to target")
  ap.add_argument("--topology", default="v4-128")
  ap.add_argument("--save", metavar="FILE", help="tpu: keep both check reports (JSON) here")
  args = ap.parse_args()
  for part in args.part or ("lengths", "cpu"):
    t0 = time.perf_counter()
    print(f"## {part}", flush=True)
    PARTS[part](args)
    print(f"({part}: {time.perf_counter() - t0:,.0f} s)", flush=True)


if __name__ == "__main__":
  main()
