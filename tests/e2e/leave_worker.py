"""One process of test_leaving's jobs (not collected): a two-process jax.distributed job on
127.0.0.1 that ends as `mlbench` ends (`runtime.leave`), each process with its peer watch.
Process 1 leaves at once with exit code `--code`, failed (not finished); process 0 leaves
`--delay` seconds later with 0, its run finished: still running when process 1 fails, or
done by then.
"""

from __future__ import annotations

import argparse
import sys
import time


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--code", type=int, required=True)
  p.add_argument("--delay", type=float, required=True)
  p.add_argument("--coordinator")
  p.add_argument("--num-processes", type=int)
  p.add_argument("--process-id", type=int)
  args = p.parse_args()

  from mlbench.train import runtime
  from mlbench.train.lifecycle import peers

  rt = runtime.setup(cpu_devices=1, distributed=runtime.Distributed(
      args.coordinator, args.num_processes, args.process_id))
  peers.watch(rt.process_index, rt.process_count)
  if rt.process_index == 0:
    time.sleep(args.delay)
    sys.exit(runtime.leave(0, finished=True))
  sys.exit(runtime.leave(args.code, finished=False))


if __name__ == "__main__":
  main()
