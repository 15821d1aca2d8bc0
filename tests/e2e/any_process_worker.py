"""One process of test_multihost's cache_clear test (not collected): prints, from
every process, what `runtime.any_process` answers for this process's flag."""

from __future__ import annotations

import argparse


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--flag", type=int, required=True)
  p.add_argument("--coordinator")
  p.add_argument("--num-processes", type=int)
  p.add_argument("--process-id", type=int)
  args = p.parse_args()

  from mlbench.train import runtime

  runtime.setup(cpu_devices=1, distributed=runtime.Distributed(
      args.coordinator, args.num_processes, args.process_id))
  print(int(runtime.any_process(bool(args.flag))))


if __name__ == "__main__":
  main()
