"""A checkpoint folder as orbax keeps it, and reading checkpoints back: the newest usable
one, on the resumed run's mesh.

A checkpoint is usable when all it holds reads back: its `meta` (the log so far,
the clock), its train state and metric sums. One that does not (a truncated
metadata file, a damaged array file: a disk error, an interrupted copy of the run
folder) is set aside under the name `<step>.damaged` (never deleted; orbax ignores
the name, and the resumed run can save that step again), reported in one line, and
the previous one is used. None usable is a one-line error.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from mlbench.storage import paths
from mlbench.errors import UserError

if TYPE_CHECKING:
  from mlbench.mllog import MLLog
  from mlbench.train.clock import Clock
  from mlbench.train.result import RunResult
  from mlbench.train.steps import Programs


@dataclasses.dataclass
class Restored:
  """A checkpoint read back: the run continues from `step`."""

  step: int
  state: Any
  sums: dict[str, Any]
  meta: dict[str, Any]


def why(e: BaseException) -> str:
  """What is wrong with a checkpoint, in a few words (orbax and TensorStore raise plain
  Exceptions whose text runs over many lines)."""
  text = (str(e).splitlines() or [""])[0]
  return f"{type(e).__name__}: {text[:160]}" if text else type(e).__name__


@dataclasses.dataclass
class Snapshot:
  """The run as it stood after a train step: what a checkpoint of that step holds."""

  step: int
  state: Any
  sums: Any
  log_bytes: int
  marks: dict[str, float]
  segments: dict[str, float]
  evals: list[tuple[float, float]]
  input_wait_s: float
  taken: float

  def meta(self, log_path: Any) -> dict[str, Any]:
    """The checkpoint's `meta` item (`log_path`: the run's log, None off process 0)."""
    log = ""
    if log_path is not None:
      with open(log_path, "rb") as f:
        log = f.read(self.log_bytes).decode("utf-8")
    segments = dict(self.segments)
    if "block_start" in self.marks:  # The train time of the block in progress, so far.
      segments["train"] = segments.get("train", 0.0) + self.taken - self.marks["block_start"]
    return {"step": self.step, "log": log, "marks": self.marks, "segments": segments,
            "evals": self.evals, "input_wait_s": self.input_wait_s, "taken": self.taken}


ITEMS = ("state", "sums", "meta")
"""What a checkpoint holds (see `mlbench.train.lifecycle.checkpoint`)."""


def _array_handlers() -> Any:
  """Array handling without replica-parallel saving.

  orbax's default splits each replicated array across its replicas so that
  they write in parallel; the slicing compiles one XLA program per array shape,
  inside `save()`: the first save of the ResNet-50 mini stalled the step loop
  for 22 s (a 100-shape pytree: 106 s, against 0.17 s without it). One replica
  writing each array is what a data-parallel pod wants anyway.
  """
  import orbax.checkpoint as ocp

  registry = ocp.type_handlers.create_type_handler_registry(
      (jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False)))
  return ocp.PyTreeCheckpointHandler(type_handler_registry=registry)


def manager(directory: paths.Path, on_saved: Callable[[], None] | None = None,
            barrier: Callable[..., None] | None = None, timeout_s: float | None = None) -> Any:
  """The run's orbax CheckpointManager; `on_saved` runs when a save is committed; `barrier`
  is the one its saves meet the other processes at (`agreement.SaveVotes.barrier`), every
  wait of a save bounded by `timeout_s` (default `savetime.FLOOR_S`; orbax's own default is
  20 minutes)."""
  import orbax.checkpoint as ocp

  from mlbench.train.lifecycle import savetime

  options = ocp.CheckpointManagerOptions(
      enable_async_checkpointing=True, create=True,
      preservation_policy=ocp.checkpoint_managers.LatestN(n=2),
      async_options=ocp.AsyncOptions(post_finalization_callback=on_saved,
                                     barrier_sync_fn=barrier,
                                     timeout_secs=math.ceil(timeout_s or savetime.FLOOR_S)))
  return ocp.CheckpointManager(
      paths.resolve(directory), options=options, item_names=ITEMS,
      item_handlers={"state": _array_handlers(), "sums": _array_handlers(),
                     "meta": ocp.JsonCheckpointHandler()})


def _manager(directory: paths.PathLike) -> Any:
  return manager(paths.path(directory))


def steps(directory: paths.PathLike) -> list[int]:
  """The committed checkpoints' steps in `directory`, newest first."""
  mgr = _manager(directory)
  try:
    return sorted(mgr.all_steps(), reverse=True)
  finally:
    mgr.close()


def restore(directory: paths.PathLike, abstract_state: Any, sums_sharding: dict[str, Any],
            step: int | None = None) -> Restored:
  """The checkpoint of `step` (default: the latest), laid out as `abstract_state` asks.

  `abstract_state` carries the shardings of the resumed run's mesh, which may
  differ from the mesh that saved it: orbax reads each shard it needs.
  """
  import orbax.checkpoint as ocp

  rng = abstract_state.rng
  target = abstract_state.replace(rng=jax.ShapeDtypeStruct(
      jax.eval_shape(jax.random.key_data, rng).shape, jnp.uint32, sharding=rng.sharding))
  sums = {k: jax.ShapeDtypeStruct((), jnp.float32, sharding=s) for k, s in sums_sharding.items()}
  mgr = _manager(directory)
  try:
    step = mgr.latest_step() if step is None else step
    got = mgr.restore(step, args=ocp.args.Composite(
        state=_pytree_restore(target), sums=_pytree_restore(sums), meta=ocp.args.JsonRestore()))
  finally:
    mgr.close()
  state = got.state.replace(rng=jax.random.wrap_key_data(got.state.rng))
  return Restored(step=int(step), state=state, sums=dict(got.sums), meta=dict(got.meta))


def _pytree_restore(target: Any) -> Any:
  import orbax.checkpoint as ocp

  return ocp.args.PyTreeRestore(item=target,
                                restore_args=ocp.checkpoint_utils.construct_restore_args(target))


def abstract_state(init: Any, state_sharding: Any, mesh: Any) -> Any:
  """The train state's shapes and shardings, from the init function alone."""
  from mlbench.train import mesh as mesh_lib

  rng_spec = jax.ShapeDtypeStruct((), jnp.uint32, sharding=mesh_lib.replicated(mesh))
  shapes = jax.eval_shape(init, rng_spec)
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                      shapes, state_sharding)


def read_meta(directory: paths.PathLike, step: int | None = None) -> dict[str, Any]:
  """The `meta` item of the checkpoint of `step` (default: the latest); no arrays are read.
  The state's and sums' tree metadata are read too, so a checkpoint whose metadata is
  damaged fails here, before the run uses its log."""
  import orbax.checkpoint as ocp

  mgr = _manager(directory)
  try:
    step = mgr.latest_step() if step is None else step
    got = mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    for item in ("state", "sums"):
      if mgr.item_metadata(step)[item] is None:
        raise ValueError(f"no {item} in the checkpoint")
  finally:
    mgr.close()
  return dict(got.meta)


def continue_clock(clock: Clock, result: RunResult, meta: dict[str, Any],
                   now: float | None = None) -> None:
  """Puts the clock and results back as they were at the checkpoint.

  Time keeps counting from the original `run_start`: the time between the
  checkpoint and this resume (`now`) is accounted as `lost` (work redone, downtime).
  """
  clock.marks.update(meta["marks"])
  clock.segments.update(meta["segments"])
  clock.add("lost", (time.time() if now is None else now) - meta["taken"])
  result.evals = [tuple(e) for e in meta["evals"]]
  result.input_wait_s = float(meta["input_wait_s"])


def set_aside(directory: paths.PathLike, step: int) -> paths.Path:
  """Renames a damaged checkpoint `<step>` to `<step>.damaged` (`.damaged-<i>` if taken);
  in a bucket, where nothing renames a folder, its objects are copied, then removed."""
  directory = paths.path(directory)
  src, dst, i = directory / str(step), directory / f"{step}.damaged", 1
  while dst.exists():
    dst, i = directory / f"{step}.damaged-{i}", i + 1
  if not paths.is_remote(directory):
    os.rename(src, dst)
    return dst
  from mlbench.storage import writes

  for f in [f for f in src.rglob("*") if not f.is_dir()]:
    f.copy(dst / f.relative_to(src), overwrite=True)
  for f in [f for f in src.rglob("*") if not f.is_dir()]:
    writes.remove(f)
  return dst


def newest_readable(directory: paths.PathLike, *, below: int | None = None,
                    leader: bool = True) -> tuple[int, dict[str, Any], list[tuple[int, str]]]:
  """(step, meta, damaged) of the newest checkpoint (older than `below`) whose metadata
  reads back; the damaged ones newer than it are set aside by the `leader` process.

  Raises:
    UserError: no checkpoint is usable.
  """
  damaged = []
  for step in steps(directory):
    if below is not None and step >= below:
      continue
    try:
      return step, read_meta(directory, step), damaged
    except Exception as e:  # orbax, TensorStore, json: any failure to read it back.
      damaged.append((step, why(e)))
      if leader:
        set_aside(directory, step)
  raise UserError(none_usable(directory, damaged))


def readable(directory: paths.PathLike, step: int, abstract_state: Any,
             sums_sharding: dict[str, Any], *,
             leader: bool) -> tuple[Restored, list[tuple[int, str]]]:
  """The checkpoint of `step`, or (its arrays damaged) the newest older one that reads
  back whole; and the damaged ones, set aside by the `leader` process.

  Raises:
    UserError: none reads back.
  """
  damaged: list[tuple[int, str]] = []
  while True:
    try:
      return restore(directory, abstract_state, sums_sharding, step), damaged
    except Exception as e:  # orbax and TensorStore raise plain Exceptions.
      damaged.append((step, why(e)))
      if leader:
        set_aside(directory, step)
    try:
      step, _, more = newest_readable(directory, below=step, leader=leader)
    except UserError:
      raise UserError(none_usable(directory, damaged)) from None
    damaged += more


def rewind(meta: dict[str, Any], clock: Clock, result: RunResult, log_path: Any) -> None:
  """The run continues from an older checkpoint (`meta`) than the one its log and clock
  were continued from: cut the log back to that checkpoint's (a prefix of it), and redo
  the clock."""
  started = clock.marks["resume_start"]
  clock.marks.clear()
  clock.segments.clear()
  continue_clock(clock, result, meta, now=started)
  clock.marks["resume_start"] = started
  if log_path is not None:
    prefix = meta["log"].encode()
    with open(log_path, "rb") as f:
      assert f.read(len(prefix)) == prefix, "a checkpoint's log is a prefix of the later ones'"
    os.truncate(log_path, len(prefix))


def none_usable(directory: paths.PathLike, damaged: list[tuple[int, str]]) -> str:
  found = "; ".join(f"step {s}: {w}" for s, w in damaged) or "none there"
  return (f"--resume {directory}: no checkpoint there can be restored ({found}); damaged "
          "ones were renamed <step>.damaged; start a new run")


def report(directory: paths.PathLike, damaged: list[tuple[int, str]], step: int) -> list[str]:
  """One line per damaged checkpoint set aside, naming the one the run resumes from."""
  return [f"warning: the checkpoint of step {s} in {directory} is damaged ({w}); it is kept "
          f"as {s}.damaged and the run resumes from step {step}" for s, w in damaged]


def placed(got: Restored, programs: Programs, clock: Clock, log: MLLog, *,
           directory: paths.Path, devices: int) -> tuple[Any, Any]:
  """The restored state and sums on the run's mesh, once every process has chosen its
  checkpoint; the clock and the log say the resume."""
  if jax.process_count() > 1:  # Every process past its choice before anyone saves again.
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices("mlbench-restored")
  state = jax.device_put(got.state, programs.state_sharding)
  sums = jax.device_put(got.sums, programs.sums_sharding)
  t = clock.mark("resumed", state)
  clock.add("init", clock.between("resume_start", "resumed"))
  clock.marks["block_start"] = clock.marks["resumed"]
  # Not an MLPerf key (the checker ignores it): tells a reader, and validate, that this
  # run continued from a checkpoint, from which step, and what it cost.
  log.event("mlbench_resumed", got.step, {
      "checkpoint": str(directory), "devices": devices,
      "lost_s": round(clock.marks["resume_start"] - got.meta["taken"], 3)}, time_ms=t)
  return state, sums
