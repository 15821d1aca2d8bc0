"""Goodput counts every second once: the input wait of a block cut short by a signal too."""

from __future__ import annotations

import os
import signal
import time

import jax
import jax.numpy as jnp
import pytest

from mlbench.errors import Interrupted
from mlbench.mllog import MLLog
from mlbench.train import goodput, loop, steps
from mlbench.train.lifecycle import checkpoint, restore, signals
from mlbench.train.clock import Clock
from mlbench.train.progress import RunProgress
from mlbench.train.result import RunResult

WAIT_S = 0.05  # what the input pipeline makes each step wait


def _programs() -> steps.Programs:
  """A real (tiny) compiled train step over a real TrainState."""

  def train(state, sums, batch):
    return (state.replace(step=state.step + 1, params={"w": state.params["w"] + batch["x"]}),
            {"loss": sums["loss"] + batch["x"].sum()})

  return steps.Programs(init=None, train=jax.jit(train), eval=None, state_sharding=None,
                        metric_names=("loss",), sums_sharding=None, batch_sharding=None,
                        train_spec={}, eval_spec={})


def _slow_input(batch, stop_after: int):
  """`batch` again and again, each taking WAIT_S to arrive; SIGTERM while the last one is
  on its way."""
  for i in range(1000):
    if i == stop_after - 1:
      os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(WAIT_S)
    yield None, batch


def test_an_interrupted_blocks_input_wait_is_in_its_checkpoint_and_goodput(tmp_path):
  state = steps.TrainState(step=jnp.zeros((), jnp.int32), params={"w": jnp.zeros(4)},
                           model_state={}, opt_state={}, rng=jax.random.key(0))
  programs, sums = _programs(), {"loss": jnp.zeros(())}
  programs.train(state, sums, {"x": jnp.ones(4)})  # compiled before the clock runs
  clock, result = Clock(), RunResult(seed=0)
  saver = checkpoint.RunSaver(tmp_path / "ck", every=0)
  saver.start(clock, result, MLLog(None))
  progress = RunProgress(title="t", total_samples=100, train_examples=10, enabled=False)
  for mark in ("init_start", "init_stop", "run_start", "block_start"):
    clock.mark(mark)
  with pytest.raises(Interrupted), signals.StopOnSignals(grace_s=60):
    loop._train_block(programs, state, _slow_input({"x": jnp.ones(4)}, 6), 20, 1, progress,
                      result=result, sums=sums, saver=saver)
  assert saver.final() == 6
  saver.close()

  meta = restore.read_meta(tmp_path / "ck")  # what a resumed run continues from
  assert meta["input_wait_s"] >= 6 * WAIT_S
  assert meta["segments"]["train"] >= meta["input_wait_s"]
  resumed, again = Clock(), RunResult(seed=0)
  restore.continue_clock(resumed, again, meta)
  resumed.mark("run_stop")
  g = goodput.measure(resumed, again.input_wait_s)
  assert g.input_wait_s == meta["input_wait_s"]
  assert g.productive_s <= meta["segments"]["train"] - 6 * WAIT_S  # the waits are not productive
  parts = (g.productive_s, g.init_s, g.eval_s, g.checkpoint_s, g.input_wait_s, g.restarts_s)
  assert sum(parts) + g.other_s == pytest.approx(g.total_s)  # each second once
  assert g.other_s >= 0
