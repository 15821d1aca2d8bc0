"""BERT and WMT come preprocessed from MLPerf: `prepare` says where from, `verify` checks."""

from __future__ import annotations

import numpy as np
import pytest

from mlbench.cli import main
from mlbench.datasets import records

SEQ, PREDS = 16, 4


def _bert(i: int) -> bytes:
  ints = {k: np.arange(SEQ, dtype=np.int64) + i for k in ("input_ids", "input_mask",
                                                           "segment_ids")}
  ints |= {k: np.arange(PREDS, dtype=np.int64) for k in ("masked_lm_positions", "masked_lm_ids")}
  return records.serialize({**ints, "masked_lm_weights": np.ones(PREDS, np.float32),
                            "next_sentence_labels": np.array([i % 2], np.int64)})


@pytest.mark.parametrize("dataset", ["bert", "wmt"])
def test_prepare_says_where_the_set_comes_from(dataset, tmp_path, capsys):
  assert main(["data", "prepare", dataset, "--raw", str(tmp_path), "--out", str(tmp_path)]) == 2
  err = capsys.readouterr().err
  assert err.startswith(f"error: {dataset} is not prepared by mlbench: use ")
  assert "mlcommons/training" in err and err.count("\n") == 1


def test_verify_bert_holds_it_to_the_reference(tmp_path, capsys):
  for name in ("part-00000-of-00500", "part-00001-of-00500"):
    records.write(tmp_path / name, [_bert(i) for i in range(3)])
  records.write(tmp_path / "eval_10k", [_bert(i) for i in range(5)])
  assert main(["data", "verify", "bert", str(tmp_path), "--full"]) == 1
  out = capsys.readouterr()
  assert "train schema" in out.out and "eval schema" in out.out
  assert "check(s) failed: train files, train numbering, eval records" in out.err


def test_verify_wmt_finds_a_wrong_feature_type(tmp_path, capsys):
  good = records.serialize({"inputs": np.array([5, 6, 1], np.int64),
                            "targets": np.array([7, 1], np.int64)})
  records.write(tmp_path / "translate_ende_wmt32k-train-00000-of-00001", [good])
  records.write(tmp_path / "translate_ende_wmt32k-dev-00000-of-00001", [good])
  assert main(["data", "verify", "wmt", str(tmp_path)]) == 0
  bad = records.serialize({"inputs": np.array([0.5], np.float32), "targets": [b"x"]})
  records.write(tmp_path / "translate_ende_wmt32k-dev-00000-of-00001", [bad])
  capsys.readouterr()
  assert main(["data", "verify", "wmt", str(tmp_path)]) == 1
  assert "wrong: inputs (float), targets (bytes)" in capsys.readouterr().out
  records.write(tmp_path / "translate_ende_wmt32k-dev-00000-of-00001", [good])
  (tmp_path / "translate_ende_wmt32k-train-00000-of-00001").write_bytes(b"\x00" * 40)
  assert main(["data", "verify", "wmt", str(tmp_path)]) == 1
  assert "translate_ende_wmt32k-train-00000-of-00001: DataLossError" in capsys.readouterr().out
