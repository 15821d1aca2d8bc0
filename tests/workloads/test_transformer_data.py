"""The Transformer's full-config data as the references have it: packed and unpacked
training records both read right, and BLEU on the raw newstest2014 sentences, which the
reference's subword encoding turns into evaluation records."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mlbench.datasets import records
from mlbench.errors import UserError
from mlbench.train import data
from mlbench.workload import Split
from workloads.transformer import bleu, config, input_pipeline, newstest, train, vocab

# A tensor2tensor vocabulary small enough to encode by hand: a few words, and every
# character an escape needs.
SUBTOKENS = ["<pad>", "<EOS>", "the_", "ca", "t_", "._", "a", "b", "_", "\\", "u", ";", "1",
             "2", "3", "0", "9", " ", ".", "c", "t", "h", "e", "4", "5", "6", "7", "8"]
EN = ["the cat.", "a cat.", "the cat. the cat."]
DE = ["a_b", "the cat.", "tea cub."]


@pytest.fixture
def vocab_file(tmp_path):
  path = tmp_path / "vocab.ende.32768"
  path.write_text("".join(f"'{t}'\n" for t in SUBTOKENS), encoding="utf-8")
  return path


def test_subword_encoding_is_the_references(vocab_file):
  """By hand, from tokenizer.py's rules: split at letter/other boundaries, drop the lone
  space between words, escape (`_` -> `\\u`, outside the alphabet -> `\\233;`), end with
  `_`, take the longest subtoken first."""
  words = vocab.SubwordVocabulary(vocab_file)
  assert words.encode("the cat.") == [2, 3, 4, 5]         # the_ | ca t_ | ._
  assert words.encode("a_b") == [6, 8, 9, 10, 8, 7, 8]    # a _ | \ u _ | b _
  assert words.encode("é") == [9, 13, 14, 14, 11, 8]     # \ 2 3 3 ; _
  for text in ("the cat.", "  a  b ", "tea_cub\\b", "x\ny", "über, 42!", ""):
    assert words.decode(words.encode(text)) == text  # the encoding is invertible


def _cfg(packed: bool):
  cfg = config.mini()
  return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, max_length=12,
                                                           packed=packed))


def _decoded(cfg, files):
  tf = data.tf()
  ds = tf.data.TFRecordDataset(files).map(
      lambda r: input_pipeline.decode(cfg, Split.TRAIN)(r, tf.zeros([2], tf.int64)))
  return list(ds.as_numpy_iterator())


def _write(tmp_path, rows, name="train-00000-of-00001"):
  return records.write_shards(str(tmp_path / name), [
      {k: np.asarray(v, np.int64) for k, v in row.items()} for row in rows], 1)


def test_each_record_form_decodes_right_whatever_the_config_says(tmp_path):
  one = {"inputs": [5, 9, 12, 1], "targets": [7, 8, 1]}
  packed = {"inputs": [5, 9, 1, 6, 1], "targets": [7, 1, 8, 4, 1],
            "inputs_segmentation": [1, 1, 1, 2, 2], "targets_segmentation": [1, 1, 2, 2, 2],
            "inputs_position": [0, 1, 2, 0, 1], "targets_position": [0, 1, 0, 1, 2]}
  files = _write(tmp_path, [one, packed])
  for cfg in (_cfg(True), _cfg(False)):
    alone, pairs = _decoded(cfg, files)
    assert list(alone["inputs_position"][:5]) == [0, 1, 2, 3, 0]  # not all 0
    assert list(alone["targets_segmentation"][:4]) == [1, 1, 1, 0]  # one segment
    assert list(pairs["targets_segmentation"][:6]) == [1, 1, 2, 2, 2, 0]
    assert list(pairs["inputs_position"][:6]) == [0, 1, 2, 0, 1, 0]


def test_a_run_refuses_records_of_the_other_form(tmp_path, vocab_file):
  _write(tmp_path, [{"inputs": [5, 1], "targets": [7, 1]}])
  full = config.full()
  with pytest.raises(UserError, match="are unpacked, the config expects packed ones; --set "
                                      "data.packed=false --set data.train_examples=N"):
    input_pipeline.bind(full, tmp_path)


def _wmt(tmp_path, vocab_file, en=EN, de=DE, max_length=12):
  (tmp_path / newstest.SOURCE).write_text("\n".join(en) + "\n", encoding="utf-8")
  (tmp_path / newstest.REFERENCE).write_text("\n".join(de) + "\n", encoding="utf-8")
  _write(tmp_path, [{"inputs": [5, 1], "targets": [7, 1]}])
  cfg = config.full()
  return dataclasses.replace(cfg, data=dataclasses.replace(
      cfg.data, packed=False, train_examples=1, eval_examples=len(de), max_length=max_length))


def test_bleu_is_scored_on_the_raw_newstest_sentences_it_encodes(tmp_path, vocab_file):
  cfg = _wmt(tmp_path, vocab_file, max_length=4)  # "tea cub." is cut at 4 tokens
  input_pipeline.prepare(cfg, tmp_path)
  cfg = input_pipeline.bind(cfg, tmp_path)
  assert cfg.data.bleu_reference == str(tmp_path / newstest.REFERENCE)
  records = input_pipeline.files(cfg, tmp_path, Split.EVAL)
  tf = data.tf()
  rows = [tf.train.Example.FromString(r.numpy()).features.feature
          for r in tf.data.TFRecordDataset(records)]
  words = vocab.SubwordVocabulary(vocab_file)
  assert [list(r["inputs"].int64_list.value) for r in rows] == [
      [*words.encode(s), vocab.EOS] for s in EN]  # translate.py's _encode_and_add_eos
  targets = np.zeros((3, 4), np.int64)
  for i, r in enumerate(rows):
    ids = list(r["targets"].int64_list.value)[:4]
    targets[i, :len(ids)] = ids
  assert words.decode(targets[2]) != DE[2]  # decoded targets lose the cut words
  hyps = ["a_b", "the cat", "tea"]
  part = train.host(cfg, {"translation": np.stack([np.asarray(
      [*words.encode(h), vocab.EOS, 0, 0, 0, 0, 0, 0][:8]) for h in hyps]),
      "nll": np.zeros(3), "target_tokens": np.ones(3)}, {"targets": targets})
  want = bleu.statistics(hyps, DE)
  assert all(np.array_equal(part.sums[k], v) for k, v in want.items())


def test_the_newstest_sentences_are_counted(tmp_path, vocab_file):
  cfg = _wmt(tmp_path, vocab_file, de=DE[:2])
  with pytest.raises(UserError, match="newstest2014.en has 3 sentences and newstest2014.de 2; "
                                      "the reference scores BLEU on all 2 of newstest2014"):
    input_pipeline.files(cfg, tmp_path, Split.EVAL)
  (tmp_path / newstest.SOURCE).unlink()
  with pytest.raises(UserError, match="no newstest2014.en in"):
    input_pipeline.files(cfg, tmp_path, Split.EVAL)


def test_training_pairs_over_the_length_are_left_out_as_the_references_do(tmp_path):
  """dataset.py L89-92 (both sides <= max_length, else filtered out); logged `discard`."""
  cfg = _cfg(False)
  files = _write(tmp_path, [{"inputs": [5] * 12, "targets": [7] * 12},
                            {"inputs": [5] * 13, "targets": [7, 1]},
                            {"inputs": [5, 1], "targets": [7] * 13}])
  tf = data.tf()
  kept = [bool(input_pipeline.keep(cfg, split)(r)) for split in (Split.TRAIN, Split.EVAL)
          for r in tf.data.TFRecordDataset(files)]
  assert kept == [True, False, False, True, True, True]
  assert train.hparams(config.full(), None, None)["max_sequence_length"].metadata == {
      "method": "discard"}
