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


def _newstest(folder, lines=3003):
  for name in ("newstest2014.en", "newstest2014.de"):
    (folder / name).write_text("".join(f"sentence {i}\n" for i in range(lines)))


def test_verify_wmt_finds_a_wrong_feature_type(tmp_path, capsys):
  _newstest(tmp_path)
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


def _pair(packed: bool) -> bytes:
  row = {"inputs": np.array([5, 6, 1], np.int64), "targets": np.array([7, 1], np.int64)}
  if packed:
    row |= {f"{side}_{k}": np.array([1] * n if k == "segmentation" else list(range(n)), np.int64)
            for side, n in (("inputs", 3), ("targets", 2)) for k in ("segmentation", "position")}
  return records.serialize(row)


def test_verify_wmt_says_which_form_it_found_and_refuses_both(tmp_path, capsys):
  """The reference's process_data.py writes one pair per record, numbered from 1
  (wmt32k-encoded-train-00001-of-00002); Google's are packed. An epoch is a record count,
  so one folder must not mix them. BLEU needs newstest2014's 3,003 raw sentences."""
  _newstest(tmp_path, 3002)
  for i in (1, 2):
    records.write(tmp_path / f"wmt32k-encoded-train-0000{i}-of-00002", [_pair(False)] * 2)
  (tmp_path / "wmt32k-compiled-train.lang1").write_text("not a record\n")
  assert main(["data", "verify", "wmt", str(tmp_path)]) == 1
  out = capsys.readouterr()
  assert "unpacked (2 files)" in out.out and "1..2 of 2" in out.out
  assert "check(s) failed: newstest2014.en, newstest2014.de" in out.err
  _newstest(tmp_path)
  assert main(["data", "verify", "wmt", str(tmp_path)]) == 0
  records.write(tmp_path / "wmt32k-encoded-train-00002-of-00002", [_pair(True)])
  capsys.readouterr()
  assert main(["data", "verify", "wmt", str(tmp_path)]) == 1
  out = capsys.readouterr()
  assert "packed (1 files), unpacked (1 files)" in out.out
  assert "check(s) failed: train form" in out.err
