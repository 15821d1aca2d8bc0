"""The XLA flags the runtime gives GPU runs (`mlbench.train.runtime.GPU_XLA_FLAGS`)."""

from __future__ import annotations

from mlbench.train import runtime


def test_gpu_runs_get_the_latency_hiding_scheduler_unless_the_user_set_it():
  flags = runtime.GPU_XLA_FLAGS
  assert runtime.with_flags("", flags) == (" ".join(flags), flags)
  mine = "--xla_gpu_enable_latency_hiding_scheduler=false --xla_dump_to=/tmp/x"
  assert runtime.with_flags(mine, flags) == (mine, ())
