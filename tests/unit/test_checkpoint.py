"""Checkpoints: what a save holds comes back, on another mesh too; a damaged one is skipped."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlbench.errors import UserError
from mlbench.mllog import MLLog
from mlbench.train import mesh as mesh_lib, sharding, steps
from mlbench.train.lifecycle import checkpoint, restore
from mlbench.train.clock import Clock
from mlbench.train.goodput import measure
from mlbench.train.result import RunResult


def _shardings(workload, cfg, tx, devices):
  """The ResNet mini state's shardings on `devices`, the optimizer state split over them
  (weight-update sharding), so a restore onto another count really reshards."""
  mesh = mesh_lib.make_mesh(None, devices=devices)
  rng = jax.ShapeDtypeStruct((), np.uint32, sharding=mesh_lib.replicated(mesh))
  shapes = jax.eval_shape(steps.init_fn(workload, cfg, tx), rng)
  sh = sharding.tree_shardings(shapes, workload.partition_rules(cfg), mesh)
  sh = sh.replace(opt_state=sharding.over_data(shapes.opt_state, sh.opt_state, mesh))
  return mesh, sh


@pytest.mark.slow  # Compiles the ResNet-50 init twice (~35 s here).
def test_a_checkpoint_of_8_devices_restores_onto_4_bit_for_bit(tmp_path):
  from workloads.resnet50 import WORKLOAD, config

  cfg = config.mini()
  tx = WORKLOAD.optimizer(cfg, WORKLOAD.schedule(cfg))
  init = steps.init_fn(WORKLOAD, cfg, tx)
  mesh8, sh8 = _shardings(WORKLOAD, cfg, tx, jax.devices()[:8])
  state = jax.jit(init, out_shardings=sh8)(mesh_lib.replicated_value(mesh8, np.uint32(7)))
  sums = {"loss": mesh_lib.replicated_value(mesh8, np.float32(3.5))}
  log = tmp_path / "log.txt"
  log.write_text(":::MLLOG line 1\n")
  clock, result = Clock(), RunResult(seed=7)
  clock.mark("init_start")
  result.evals = [(1, 0.25)]
  ckpts = checkpoint.Checkpoints(tmp_path / "ckpt", 5, clock, result, log)
  ckpts.after_step(4, state, sums)   # Not a multiple of 5: remembered, not saved.
  assert ckpts.saves == []
  ckpts.after_step(5, state, sums)
  assert [s for s, _ in ckpts.saves] == [5]
  with open(log, "a") as f:
    f.write(":::MLLOG line 2, after the checkpoint\n")
  ckpts.close()

  mesh4, sh4 = _shardings(WORKLOAD, cfg, tx, jax.devices()[:4])
  abstract = restore.abstract_state(init, sh4, mesh4)
  got = restore.restore(tmp_path / "ckpt", abstract,
                        {"loss": mesh_lib.replicated(mesh4)})
  assert got.step == 5 and float(got.sums["loss"]) == 3.5
  assert got.meta["log"] == ":::MLLOG line 1\n" and got.meta["evals"] == [[1, 0.25]]
  leaves4 = jax.tree.leaves(got.state.replace(rng=jax.random.key_data(got.state.rng)))
  leaves8 = jax.tree.leaves(state.replace(rng=jax.random.key_data(state.rng)))
  opt4 = [x for x in jax.tree.leaves(got.state.opt_state) if x.ndim]
  assert any(len(x.sharding.device_set) == 4 and not x.sharding.is_fully_replicated for x in opt4)
  for a, b in zip(leaves4, leaves8, strict=True):
    assert a.sharding.device_set <= set(jax.devices()[:4])
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_goodput_splits_the_wall_time_by_the_runs_own_events():
  t = iter([0.0, 10.0, 11.0])
  clock = Clock(now=lambda: next(t))
  clock.mark("init_start"), clock.mark("init_stop"), clock.mark("run_stop")
  clock.marks["run_stop"] = 100.0
  clock.add("train", 60.0), clock.add("eval", 8.0), clock.add("checkpoint", 1.0)
  clock.add("lost", 12.0), clock.add("init", 5.0)
  g = measure(clock, input_wait_s=3.0)
  assert (g.total_s, g.init_s, g.productive_s, g.restarts_s) == (100.0, 15.0, 56.0, 12.0)
  assert g.other_s == pytest.approx(100 - 15 - 8 - 1 - 3 - 12 - 56)
  assert g.goodput == pytest.approx(0.56)
  assert g.summary().startswith("goodput 56.0% of 100.0 s; badput init+compile 15.0%")


def _tiny_run(directory, log):
  """Checkpoints of steps 5 and 10 of a tiny TrainState, their logs one line apart."""
  state = steps.TrainState(step=jnp.zeros((), jnp.int32), params={"w": jnp.arange(4096.0)},
                           model_state={}, opt_state={}, rng=jax.random.key(0))
  clock, result = Clock(), RunResult(seed=0)
  clock.mark("init_start")
  log.write_text(":::MLLOG line 1\n")
  ckpts = checkpoint.Checkpoints(directory, 5, clock, result, log)
  ckpts.after_step(5, state.replace(step=jnp.int32(5)), {"loss": jnp.float32(5)})
  with open(log, "a") as f:
    f.write(":::MLLOG line 2\n")
  ckpts.after_step(10, state.replace(step=jnp.int32(10)), {"loss": jnp.float32(10)})
  ckpts.close()
  assert ckpts.durations and len(ckpts.durations) == 2  # each save timed to its commit
  return state


def _damage(directory, step, pattern):
  for f in directory.glob(f"{step}/{pattern}"):
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])


def test_a_damaged_newest_checkpoint_is_one_line_and_the_previous_one_restored(tmp_path):
  ck, said = tmp_path / "ck", []
  _tiny_run(ck, tmp_path / "log")
  _damage(ck, 10, "meta/metadata")  # Truncated metadata: found before the log is used.
  saver = checkpoint.RunSaver(ck, 5, resuming=True, say=said.append)
  assert saver.step == 5 and saver.meta["log"] == ":::MLLOG line 1\n"
  [line] = said
  assert line.startswith(f"warning: the checkpoint of step 10 in {ck} is damaged "
                         "(JSONDecodeError: ") and line.endswith(
      "; it is kept as 10.damaged and the run resumes from step 5"), line
  assert sorted(p.name for p in ck.iterdir() if p.is_dir()) == ["10.damaged", "5"]


def test_damaged_arrays_are_found_at_restore_and_the_log_and_clock_go_back_too(tmp_path):
  ck, said = tmp_path / "ck", []
  state = _tiny_run(ck, tmp_path / "log")
  _damage(ck, 10, "state/ocdbt.process_0/d/*")  # The arrays: only a restore reads them.
  saver = checkpoint.RunSaver(ck, 5, resuming=True, say=said.append)
  assert saver.step == 10 and not said
  log = MLLog(tmp_path / "resumed.log", prefix=saver.meta["log"])
  clock, result = Clock(), RunResult(seed=0)
  saver.continue_clock(clock, result)
  clock.mark("resume_start")
  rep = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep), state)
  got = saver._restorable(abstract, {"loss": rep}, clock, log)
  assert got.step == 5 and int(got.state.step) == 5 and float(got.sums["loss"]) == 5
  np.testing.assert_array_equal(got.state.params["w"], np.arange(4096.0))
  assert (tmp_path / "resumed.log").read_text() == ":::MLLOG line 1\n"  # step 5's log
  assert clock.segments["lost"] == pytest.approx(clock.marks["resume_start"]
                                                 - got.meta["taken"])
  [line] = said
  assert line.startswith(f"warning: the checkpoint of step 10 in {ck} is damaged (")
  assert line.endswith("the run resumes from step 5")
  log.close()


def test_no_usable_checkpoint_is_one_line(tmp_path, capsys):
  ck = tmp_path / "ck"
  _tiny_run(ck, tmp_path / "log")
  for step in (5, 10):
    _damage(ck, step, "state/_METADATA")
  with pytest.raises(UserError) as e:
    checkpoint.RunSaver(ck, 5, resuming=True)
  message = str(e.value)
  assert message.startswith(f"--resume {ck}: no checkpoint there can be restored (step 10: "
                            "JSONDecodeError") and "; step 5: JSONDecodeError" in message
  assert "\n" not in message and message.endswith("start a new run")
