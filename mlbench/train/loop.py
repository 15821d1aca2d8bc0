"""The time-to-quality loop.

    cache_clear -> init_start -> (log what runs; compile from shapes; init the
    state) -> init_stop -> run_start -> [block: train to the next evaluation
    point; evaluate] ... -> run_stop

The data is first touched after `run_start`. Evaluation points come from the
rules' cadence; the run stops with status `success` at the first evaluation
that reaches the target, or `aborted` when the training budget is spent. Every
timestamp is read after the devices finish (`Clock`). Process 0 writes the log.
"""

from __future__ import annotations

import itertools
import math
import time
from typing import Any

import jax
import numpy as np

from mlbench.train import data, evaluate, goodput, mesh as mesh_lib, mfu, pipeline
from mlbench.train import runtime as runtime_lib
from mlbench.train import steps, telemetry
from mlbench.train.lifecycle import signals
from mlbench.train.telemetry import Telemetry
from mlbench.train.clock import Clock
from mlbench.train.lifecycle.checkpoint import RunSaver
from mlbench.errors import UserError
from mlbench.mllog import MLLog
from mlbench.train.plan import Plan, Point
from mlbench.train.progress import RunProgress
from mlbench.train.result import RunResult
from mlbench.workload import Split


def run_once(plan: Plan, seed: int, log: MLLog, progress: RunProgress,
             saver: RunSaver | None = None, tele: Telemetry | None = None) -> RunResult:
  """One complete time-to-quality run, logged to `log`.

  With `saver` (see mlbench.train.lifecycle.checkpoint via the runner), the run saves
  checkpoints, or continues from one when `saver.resuming`; with `tele`, it writes
  TensorBoard scalars and traces the profile window (see telemetry).
  """
  clock, result, tele = Clock(), RunResult(seed=seed), tele or telemetry.disabled()
  result.tensorboard_dir = tele.logdir if tele.writes else None
  # Untimed: before the clock's first mark.
  result.flops_per_example, peak = mfu.prepare(plan, progress)
  result.peak_flops_per_s, result.peak_source = peak.flops_per_s, peak.source
  if saver is not None and saver.resuming:
    saver.continue_clock(clock, result)  # The log so far is already in `log`.
    clock.mark("resume_start")
  else:
    cleared = runtime_lib.clear_page_cache() if plan.rc.clear_caches else False
    # Each host drops its own cache; only the leader logs, so it logs whether any did.
    log.cache_clear(runtime_lib.any_process(cleared), time_ms=clock.mark("cache_clear"))
    log.init_start(time_ms=clock.mark("init_start"))
    _log_setup(plan, seed, log)
  programs = steps.compile_programs(plan.workload, plan.cfg, plan.schedule, plan.mesh, plan.ctx,
                                    plan.tx, weight_update_sharding=plan.rc.weight_update_sharding)
  result.opt_state_bytes = programs.opt_state_bytes
  result.train_cost = _cost(programs.train)
  for used in programs.attention:  # which kernel each attention runs on, and why
    log.event("mlbench_attention", used.choice.implementation.value, used.to_json())
  start, sums = 0, None
  if saver is not None and saver.resuming:
    state, start, sums = saver.restore(plan, programs, clock, log)
    progress.advance(start * plan.gbs)
  else:
    log.event("mlbench_optimizer_state_bytes_per_device", programs.opt_state_bytes)
    state = programs.init_state(seed)
    log.init_stop(time_ms=clock.mark("init_stop", state))
    log.run_start(time_ms=clock.mark("run_start"))
  result.init_s = clock.between("init_start", "init_stop")
  if saver is not None:
    saver.start(clock, result, log)
  _train_and_evaluate(plan, programs, state, seed, log, clock, progress, result,
                      start=start, sums=sums, saver=saver, tele=tele)
  result.time_to_train_s = clock.between("run_start", "run_stop")
  result.goodput = goodput.measure(clock, result.input_wait_s)
  result.train_s, result.eval_s = clock.segments["train"], clock.segments["eval"]
  return result


def _log_setup(plan: Plan, seed: int, log: MLLog) -> None:
  log.submission(benchmark=plan.workload.benchmark, org=plan.rc.submitter,
                 division=plan.rc.division.value, status=plan.log_status, platform=plan.system)
  log.seed(seed)
  converged = plan.rule.train_samples == "converged"  # logged at the end instead
  log.hyperparameters({k: v for k, v in plan.hparams.items()
                       if not (converged and k == "train_samples")})
  # Not an MLPerf key (the checker ignores unknown keys): tells validate and
  # compare which rules this log follows, which they otherwise infer from dates.
  log.event("mlbench_ruleset", plan.rule.ruleset)
  if plan.runtime.xla_flags:  # what the harness set for the platform (never the user's own)
    log.event("mlbench_xla_flags", " ".join(plan.runtime.xla_flags))
  packing = plan.schedule.packing
  if packing is not None:  # Sequences per step stay global_batch_size, in fewer rows.
    rows = plan.schedule.rows()
    log.event("mlbench_packing", round(plan.gbs / rows, 4), {
        "rows_per_step": rows, "sequences_per_step": plan.gbs,
        "max_sequences_per_row": packing.max_per_row, "sized_for": packing.factor})
  stages = pipeline.stage_count(plan.mesh)
  if stages > 1:  # The schedule whose bubble every step's time includes (never off the clock).
    log.event("mlbench_pipeline", stages, {
        "microbatches": plan.ctx.microbatches,
        "bubble_fraction": round(pipeline.bubble_fraction(stages, plan.ctx.microbatches), 4)})


def _train_and_evaluate(plan: Plan, programs: steps.Programs, state: Any, seed: int, log: MLLog,
                        clock: Clock, progress: RunProgress, result: RunResult, *,
                        start: int = 0, sums: Any = None, saver: RunSaver | None = None,
                        tele: Telemetry | None = None) -> None:
  """Blocks of training and evaluations until the target or the budget; logs run_stop.

  run_stop is logged here, while the input pipelines are still alive: tearing
  them down is not part of the run. A resumed run starts at step `start`
  (inside a block whose block_start is already logged) with that block's `sums`.
  """
  tele = tele or telemetry.disabled()
  train_batches = _train_iterator(plan, programs, seed, skip=start)
  eval_ds = _eval_dataset(plan, seed)
  step, block_first, first_epoch = start, 0, 1
  for point in plan.points:
    if point.step < start:  # Done before the checkpoint this run resumed from.
      block_first, first_epoch = point.step, point.epoch + 1
      continue
    if step == block_first:
      log.block_start(first_epoch, point.epoch - first_epoch + 1, step * plan.gbs,
                      time_ms=clock.mark("block_start"))
    waited = result.input_wait_s
    state, sums = _train_block(programs, state, train_batches, point.step - step, plan.gbs,
                               progress, result=result, sync=plan.runtime.simulated_pod,
                               first_step=step, sums=sums, saver=saver, tele=tele)
    block_s = clock.since("block_start", state)
    clock.add("train", block_s)
    waited = result.input_wait_s - waited
    result.train_metrics = _mean_metrics(sums, point.step - block_first)
    tele.block(point.step, result.train_metrics, (point.step - step) * plan.gbs, block_s, waited)
    sums = None
    step, block_first = point.step, point.step
    result.samples, result.epoch = point.samples, point.epoch
    if not all(math.isfinite(v) for v in result.train_metrics.values()):
      result.diverged = f"training diverged before epoch {point.epoch}: {result.train_metrics}"
      progress.note(f"[red]{result.diverged}; stopping the run (status aborted)")
      break
    value = _evaluate(plan, programs, state, eval_ds, point, log, clock)
    result.evals.append((point.epoch, value))
    tele.evaluated(point.step, plan.rule.quality.key, value)
    log.block_stop(first_epoch, point.samples, time_ms=clock.mark("block_stop"))
    progress.evaluated(point.epoch, plan.rule.quality.key, value, clock.since("run_start"),
                       result.samples / clock.segments["train"])
    first_epoch = point.epoch + 1
    if plan.rule.quality.reached(value):
      result.success = True
      break
  if plan.rule.train_samples == "converged":
    log.event("train_samples", result.samples)
  log.run_stop(result.success, time_ms=clock.mark("run_stop", state))


def _train_block(programs: steps.Programs, state: Any, batches: Any, n: int, gbs: int,
                 progress: RunProgress, *, result: RunResult, sync: bool = False,
                 first_step: int = 0, sums: Any = None, saver: RunSaver | None = None,
                 tele: Telemetry | None = None) -> tuple[Any, Any]:
  """`n` train steps; with `sync`, each waits for the last (see Runtime.simulated_pod).

  Each step's wait for its batch is added to `result.input_wait_s` at once, so
  a checkpoint of any step (and the goodput of a run resumed from it) has the
  waits of the block in progress. After each step: the saver's turn (a
  checkpoint every N steps), then a stop requested by a signal is honoured,
  with the state consistent.
  """
  sums = programs.fresh_sums() if sums is None else sums
  tele = tele or telemetry.disabled()
  # Implicit host<->device transfers in the hot loop are bugs (a stray numpy
  # array, a float() on a device value); make them fail instead of stall.
  with jax.transfer_guard("disallow"):
    for i in range(n):
      t0 = time.perf_counter()
      _, device_batch = _next_batch(batches, first_step + i)
      result.input_wait_s += time.perf_counter() - t0
      tele.before_step(first_step + i)
      state, sums = programs.train(state, sums, device_batch)
      tele.after_step(first_step + i, state)
      if sync:
        jax.block_until_ready(state)
      progress.advance(gbs)
      if saver is not None:
        saver.after_step(first_step + i + 1, state, sums)
      signals.check()
  return state, sums


def _next_batch(batches: Any, step: int) -> Any:
  """The next training batch. A pipeline over files that hold no records ends (tf.data's
  repeat() of nothing stops): one line, not a StopIteration traceback."""
  try:
    return next(batches)
  except StopIteration:
    raise UserError(f"the training input ran out after step {step}: this host's training "
                    "files hold no records (emptied?); check --data-dir with `mlbench data "
                    "verify`, or prepare the data again") from None


def _cost(compiled: Any) -> dict[str, float]:
  """XLA's per-device FLOPs and HBM bytes of a compiled step (empty where not counted)."""
  try:
    cost = compiled.cost_analysis()
  except Exception:  # Not every backend implements cost analysis.
    return {}
  cost = (cost[0] if cost else {}) if isinstance(cost, list) else (cost or {})
  return {k: float(cost[k]) for k in ("flops", "bytes accessed") if k in cost}


def _mean_metrics(sums: dict[str, Any], n: int) -> dict[str, float]:
  return {k: float(v) / max(n, 1) for k, v in jax.device_get(sums).items()}


def _evaluate(plan: Plan, programs: steps.Programs, state: Any, eval_ds: Any, point: Point,
              log: MLLog, clock: Clock) -> float:
  log.eval_start(point.epoch, point.samples, time_ms=clock.mark("eval_start", state))
  batches = signals.guarded(data.prefetch(data.numpy_batches(eval_ds),
                                          _putter(plan, programs, Split.EVAL)))
  metrics, _ = evaluate.evaluate(plan.workload, plan.cfg, programs.eval, state, batches,
                                 plan.schedule.eval_examples)
  value = float(metrics[plan.workload.quality_metric])
  t = clock.mark("eval_stop")
  clock.add("eval", clock.between("eval_start", "eval_stop"))
  log.eval_result(plan.rule.quality.key, value, point.epoch, point.samples, time_ms=t)
  log.eval_stop(point.epoch, point.samples, time_ms=t)
  return value


def _putter(plan: Plan, programs: steps.Programs, split: Split):
  spec = programs.train_spec if split is Split.TRAIN else programs.eval_spec
  global_batch = next(iter(spec.values())).shape[0]
  per_host = global_batch // plan.runtime.process_count
  checked = False

  def put(batch: dict[str, np.ndarray]) -> dict[str, Any]:
    nonlocal checked
    if not checked:
      _check_batch(plan, spec, batch, per_host, split)
      checked = True
    # The one intended host-to-device transfer of the hot loop (across processes
    # JAX does it through a path the transfer guard would count as implicit).
    with jax.transfer_guard("allow"):
      return mesh_lib.to_global(batch, programs.batch_sharding, global_batch)

  return put


def _check_batch(plan: Plan, spec: dict[str, Any], batch: dict[str, np.ndarray], per_host: int,
                 split: Split) -> None:
  want = {k: ((per_host,) + tuple(s.shape[1:]), np.dtype(s.dtype)) for k, s in spec.items()}
  got = {k: (tuple(v.shape), v.dtype) for k, v in batch.items()}
  if want != got:
    raise TypeError(f"{plan.workload.name}: the {split.value} pipeline yields {got} but "
                    f"synthetic_batch() promises {want}; make decode() and synthetic_batch() agree")


def _train_iterator(plan: Plan, programs: steps.Programs, seed: int, skip: int = 0):
  """The train batches on the device; the first `skip` (done before a resumed
  checkpoint) are read and dropped, so a resumed run sees the same batches."""
  spec, rt = plan.workload.input, plan.runtime
  packing = plan.schedule.packing
  if packing is not None and (spec.pack is None or spec.examples is not None):
    raise TypeError(f"{plan.workload.name}: a schedule with packing needs InputSpec.pack "
                    "(and TFRecords, read by decode)")
  if spec.examples is not None:
    batches = data.example_batches(spec.examples(plan.cfg, plan.data_dir, Split.TRAIN, seed),
                                   per_host_batch=plan.gbs // rt.process_count,
                                   host=rt.process_index, hosts=rt.process_count)
    return data.prefetch(itertools.islice(batches, skip, None),
                         _putter(plan, programs, Split.TRAIN))
  files = spec.files(plan.cfg, plan.data_dir, Split.TRAIN)
  pack = None if packing is None else spec.pack(
      plan.cfg, plan.gbs // rt.process_count, plan.schedule.rows() // rt.process_count)
  ds = data.train_dataset(files, spec.decode(plan.cfg, Split.TRAIN),
                          per_host_batch=plan.gbs // rt.process_count, seed=seed,
                          host=rt.process_index, hosts=rt.process_count,
                          opts=plan.pipeline, skip_batches=skip, keep=_keep(plan, Split.TRAIN),
                          pack=pack)
  return data.prefetch(data.numpy_batches(ds), _putter(plan, programs, Split.TRAIN))


def _eval_dataset(plan: Plan, seed: int) -> Any:
  spec, rt = plan.workload.input, plan.runtime
  if spec.examples is not None:
    return data.EvalBatches(spec.examples(plan.cfg, plan.data_dir, Split.EVAL, seed),
                            num_examples=plan.schedule.eval_examples,
                            per_host_batch=plan.schedule.eval_batch_size // rt.process_count,
                            host=rt.process_index, hosts=rt.process_count)
  files = plan.workload.input.files(plan.cfg, plan.data_dir, Split.EVAL)
  return data.eval_dataset(files, plan.workload.input.decode(plan.cfg, Split.EVAL),
                           num_examples=plan.schedule.eval_examples,
                           per_host_batch=plan.schedule.eval_batch_size // plan.runtime.process_count,
                           host=plan.runtime.process_index, hosts=plan.runtime.process_count,
                           opts=plan.pipeline, keep=_keep(plan, Split.EVAL))


def _keep(plan: Plan, split: Split) -> Any:
  keep = plan.workload.input.keep
  return keep(plan.cfg, split) if keep is not None else None
