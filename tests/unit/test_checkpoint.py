"""Checkpoints: what a save holds comes back, on another mesh too; --resume refuses clashes."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from mlbench.cli import main
from mlbench.train import checkpoint, mesh as mesh_lib, sharding, steps
from mlbench.train.clock import Clock
from mlbench.train.goodput import measure
from mlbench.train.loop import RunResult
from mlbench.storage import write_new
from mlbench.train.resume import RUN_FILE, RunRecord


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
  abstract = checkpoint.abstract_state(init, sh4, mesh4)
  got = checkpoint.restore(tmp_path / "ckpt", abstract,
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
  result = RunResult(seed=0, input_wait_s=3.0)
  g = measure(clock, result)
  assert (g.total_s, g.init_s, g.productive_s, g.restarts_s) == (100.0, 15.0, 56.0, 12.0)
  assert g.other_s == pytest.approx(100 - 15 - 8 - 1 - 3 - 12 - 56)
  assert g.goodput == pytest.approx(0.56)
  assert g.summary().startswith("goodput 56.0% of 100.0 s; badput init+compile 15.0%")


def _record(folder, **changes):
  base = dict(run_id="abcd1234", workload="resnet50", config=None, overrides=("train_epochs=1",),
              seeds=(3,), index=0, system="cpu-test", submitter="mlbench", division="closed",
              ruleset="mini", results_dir=str(folder.parent), checkpoint_every=5)
  folder.mkdir(parents=True)
  write_new(folder / RUN_FILE, RunRecord(**{**base, **changes}).to_json())
  return folder


@pytest.mark.parametrize("args, message", [
    (["--seed", "4"], "error: --seed 4 clashes with the run being resumed (3); leave --seed out"),
    (["--set", "train_epochs=2"], "error: --set ('train_epochs=2',) clashes with the run being "
                                  "resumed (('train_epochs=1',)); leave --set out"),
    (["--system", "other"], "error: --system other clashes with the run being resumed"),
])
def test_a_clashing_resume_is_one_line_before_any_compile(capsys, tmp_path, args, message):
  folder = _record(tmp_path / "ck")
  (folder / "5").mkdir()
  rc = main(["run", "resnet50", "--resume", str(folder), *args])
  err = capsys.readouterr().err
  assert rc == 2 and err.startswith(message) and err.count("\n") == 1, err


def test_resume_refuses_another_workload_no_checkpoint_and_no_record(capsys, tmp_path):
  folder = _record(tmp_path / "ck")
  assert main(["run", "resnet50", "--resume", str(folder)]) == 2
  assert "stopped before its first checkpoint" in capsys.readouterr().err
  (folder / "5").mkdir()
  assert main(["run", "bert", "--resume", str(folder)]) == 2
  assert "is a resnet50 run, not bert" in capsys.readouterr().err
  assert main(["run", "resnet50", "--resume", str(tmp_path)]) == 2
  assert "no run.json there" in capsys.readouterr().err
