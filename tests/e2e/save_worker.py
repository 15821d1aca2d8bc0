"""One process of test_pod_storage's save tests (not collected): a two-process job saving a
sharded state into a shared folder with mlbench's `Checkpoints`, as a run does between its
train steps. After the first save, which works, the storage fails as `--fault` says:

  full    process 0 fills the shared disk (a small tmpfs) to its last byte
  denied  only process 0's writes are refused (EACCES, by tests/storage/deny_writes.py)
  slow    process 0's first write of a save takes 8 s, past a save deadline of 3 s
  final   the disk fills as in `full`, and the run stops (a signal) with the save of step 10
          in flight: each process waits for its own part alone (`Checkpoints.final`)
  none    nothing fails (process 1 may be given another path of the same folder, `--dir`);
          each host first prints the bytes each host writes per save
  hang    process 1's main thread sleeps 8 s before it waits for the last save (as at a run's
          end, where no train step's collective holds process 0 back) while its heartbeat
          goes on, past a save deadline of 3 s

Each process then saves at steps 10, 15, 20 and 25 and prints one line per event on
stdout: `warn <line>`, `stop <cause> | <fix> | <newest step>`, `went on`, or (final)
`final <newest step>`. Each process starts the watch of its peers, as a run does, and
leaves as `mlbench` does (`runtime.leave`).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "storage"))
import deny_writes  # noqa: E402  (tests/storage/deny_writes.py)


def _slow_write(pattern: str) -> None:
  """The first write to a path matching `pattern` takes 8 s (an audit hook, as deny_writes)."""
  wanted, slept = re.compile(pattern), []

  def hook(event: str, args: tuple) -> None:
    path = deny_writes._writes(event, args)
    if not slept and isinstance(path, (str, bytes, os.PathLike)) and wanted.search(
        os.fsdecode(path)):
      slept.append(path)
      time.sleep(8)

  sys.addaudithook(hook)


def _args() -> argparse.Namespace:
  p = argparse.ArgumentParser()
  p.add_argument("--dir", required=True)
  p.add_argument("--fault", choices=("full", "denied", "slow", "final", "none", "hang"),
                 required=True)
  p.add_argument("--coordinator")
  p.add_argument("--num-processes", type=int)
  p.add_argument("--process-id", type=int)
  return p.parse_args()


def _fill_disk(folder: str) -> None:
  """Writes a file beside `folder` until the disk is full."""
  with open(os.path.join(os.path.dirname(folder), "filler"), "wb", buffering=0) as f:
    try:
      while True:
        f.write(b"\0" * (1 << 20))
    except OSError:  # No space left on device: full.
      pass


def main() -> None:
  args = _args()
  deny_writes.install()  # the writes MLBENCH_TEST_DENY refuses (none without it)

  from mlbench.train import runtime

  runtime.setup(cpu_devices=2, distributed=runtime.Distributed(
      args.coordinator, args.num_processes, args.process_id))
  import jax
  import numpy as np
  from jax.experimental import multihost_utils
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  from mlbench.errors import StorageFailed
  from mlbench.train import steps
  from mlbench.train.clock import Clock
  from mlbench.train.lifecycle import checkpoint, peers, savetime
  from mlbench.train.result import RunResult

  me = jax.process_index()
  peers.watch(me, jax.process_count())
  if args.fault in ("slow", "hang"):
    savetime.FLOOR_S = 3
  if args.fault == "slow" and me == 0:
    _slow_write(r"/ck/10\.orbax-checkpoint-tmp")
  mesh = Mesh(np.array(jax.devices()), ("data",))

  def array(x, spec=PartitionSpec()):  # a global array: every process holds its shards
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, NamedSharding(mesh, spec), lambda i: x[i])

  state = steps.TrainState(
      step=array(np.int32(0)), params={"w": array(np.arange(400_000, dtype=np.float32),
                                                  PartitionSpec("data"))},
      model_state={}, opt_state={}, rng=jax.random.wrap_key_data(array(
          jax.random.key_data(jax.random.key(0)))))
  sums = {"loss": array(np.float32(1))}
  if args.fault == "none":  # what each host writes per save, as every host counts it
    by_host = savetime.bytes_by_host((state, sums))
    print("bytes", *[by_host.get(p, 0) for p in range(jax.process_count())], flush=True)
  clock = Clock()
  clock.mark("init_start")
  ck = checkpoint.Checkpoints(args.dir, 5, clock, RunResult(seed=0), None,
                              say=lambda line: print("warn", line, flush=True))
  ck.after_step(5, state, sums)
  ck.settle()
  multihost_utils.sync_global_devices("saved")
  if args.fault in ("full", "final") and me == 0:
    _fill_disk(args.dir)
  multihost_utils.sync_global_devices("failing")
  if args.fault == "final":
    ck.after_step(10, state, sums)
    print("final", ck.final(), flush=True)
    ck.close()
    sys.exit(runtime.leave(0, finished=True))
  try:
    for step in (10, 15, 20, 25):
      ck.after_step(step, state, sums)
    if args.fault == "hang" and me == 1:
      time.sleep(8)
    ck.settle()
    print("went on", flush=True)
  except StorageFailed as e:
    print(f"stop {e.cause} | {e.fix} | {ck.newest()}", flush=True)
    ck.leave()
  multihost_utils.sync_global_devices("done")
  sys.exit(runtime.leave(0, finished=True))


if __name__ == "__main__":
  main()
