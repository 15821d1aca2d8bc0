"""The references' starting points: BERT phase 2 from the phase-1 checkpoint, SSD from an
ImageNet ResNet-34 backbone. A closed full run without one is refused before any compile,
in one line that names everything missing; an open run starts at random and logs it;
`--init-checkpoint` is each workload's starting point, or refused where there is none."""

from __future__ import annotations

import pytest

from mlbench.cli import main


def _run(capsys, tmp_path, *args: str) -> str:
  rc = main(["run", *args, "--results-dir", str(tmp_path / "results")])
  err = capsys.readouterr().err
  assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
  written = [p for p in (tmp_path / "results").rglob("*") if p.is_file()]
  assert not written  # refused before anything is written
  return err


def test_a_closed_bert_run_names_its_data_and_the_phase1_checkpoint_at_once(capsys, tmp_path):
  err = _run(capsys, tmp_path, "bert", "--config", "full", "--data-dir", str(tmp_path / "none"))
  assert err.startswith("error: bert (full) cannot start; missing: no part-* TFRecord files in ")
  assert "; and the phase-1 checkpoint model.ckpt-28252, which the closed division requires " \
         "(--init-checkpoint PATH; the tf1_ckpt folder of the MLPerf BERT input files" in err
  assert "--division open to start from random weights" in err


def test_a_closed_ssd_run_with_its_data_still_needs_the_backbone(capsys, tmp_path):
  for name in ("coco_train.record-00000-of-00001", "coco_val.record-00000-of-00001"):
    (tmp_path / name).write_bytes(b"")  # listed, not read: the check reads nothing
  err = _run(capsys, tmp_path, "ssd", "--config", "full", "--data-dir", str(tmp_path))
  assert err.startswith("error: ssd (full) cannot start; missing: the ImageNet ResNet-34 "
                        "backbone, which the closed division requires")
  assert "resnet34-333f7ec4.pth" in err and "python -m workloads.ssd.backbone" in err


def test_init_checkpoint_is_the_ssd_backbone_and_must_exist(capsys, tmp_path):
  err = _run(capsys, tmp_path, "ssd", "--config", "full", "--data-dir", str(tmp_path / "none"),
             "--init-checkpoint", str(tmp_path / "resnet34.npz"))
  assert "no coco_train.record-* or train-* TFRecord files" in err
  assert f"; and the ImageNet ResNet-34 backbone: {tmp_path / 'resnet34.npz'} does not exist" in err


def test_init_checkpoint_is_refused_where_the_reference_starts_at_random(capsys, tmp_path):
  err = _run(capsys, tmp_path, "resnet50", "--init-checkpoint", str(tmp_path / "x"))
  assert err.startswith("error: resnet50 starts from random weights, as its reference does: "
                        "it takes no --init-checkpoint (workloads that do: bert, ssd)")


@pytest.mark.parametrize("workload", ["bert", "ssd"])
def test_an_open_run_starts_at_random_and_logs_it(workload, tmp_path):
  from mlbench.config import Division, RunConfig
  from mlbench.errors import UserError
  from mlbench.train import plan as plan_lib, runtime
  from mlbench.workload import unpack

  rc = RunConfig(workload=workload, config="full", data_dir=tmp_path, results_dir=tmp_path,
                 division=Division.OPEN)
  plan = plan_lib.make_plan(rc, runtime.setup())
  value, meta = unpack(plan.hparams["weights_initialization"])
  assert value == "random" and meta["reference_starts_from"] == plan.workload.start.name
  with pytest.raises(UserError) as e:  # only the data is missing in the open division
    plan_lib.check_inputs(plan)
  assert str(e.value).startswith("no ") and "requires" not in str(e.value)
