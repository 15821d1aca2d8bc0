"""Packed WMT records, as Google's MLPerf Transformer trains on them
(training_results_v0.7 Google/benchmarks/transformer/implementations/
transformer-research-JAX-tpu-v3-8192: mlperf_input_pipeline.py L22-28, models.py):
several sentence pairs per record, attention only within a pair, positions
restarting at each pair; and unpacked records through the same model path."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlbench.datasets import records
from mlbench.errors import UserError
from mlbench.train import data
from mlbench.workload import Split
from workloads.transformer import WORKLOAD, config, input_pipeline
from workloads.transformer.model import Transformer, shift_right

PAIRS = [([5, 9, 12, 1], [7, 8, 1]), ([6, 11, 1], [13, 10, 4, 1])]


def _cfg():
  cfg = config.mini()
  return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, max_length=12, packed=True))


def _packed_record(tmp_path):
  row = {k: [] for k in ("inputs", "targets", *input_pipeline.PACKING)}
  for seg, (src, tgt) in enumerate(PAIRS, start=1):
    for side, ids in (("inputs", src), ("targets", tgt)):
      row[side] += ids
      row[f"{side}_segmentation"] += [seg] * len(ids)
      row[f"{side}_position"] += list(range(len(ids)))
  return records.write_shards(str(tmp_path / "train-{index:05d}-of-{count:05d}"),
                              [{k: np.asarray(v, np.int64) for k, v in row.items()}], 1)


def _decoded(cfg, files, split):
  tf = data.tf()
  ds = tf.data.TFRecordDataset(files).map(
      lambda r: input_pipeline.decode(cfg, split)(r, tf.zeros([2], tf.int64)))
  return {k: v[None] for k, v in next(ds.as_numpy_iterator()).items()}


def _pad(ids, n=12):
  return np.asarray([ids + [0] * (n - len(ids))], np.int32)


def test_packed_pairs_compute_as_if_alone(tmp_path):
  cfg = _cfg()
  batch = _decoded(cfg, _packed_record(tmp_path), Split.TRAIN)
  assert list(batch["targets_position"][0, :7]) == [0, 1, 2, 0, 1, 2, 3]
  params, _ = WORKLOAD.init(cfg, jax.random.key(0))
  model = Transformer(cfg.model)
  packing = {k: batch[k] for k in input_pipeline.PACKING}
  enc = model.apply({"params": params}, batch["inputs"], packing=packing, method=model.encode)
  logits = model.apply({"params": params}, batch["inputs"], batch["targets"], packing=packing)
  (src1, tgt1), (src2, tgt2) = PAIRS
  alone1 = model.apply({"params": params}, _pad(src1), method=model.encode)
  alone2 = model.apply({"params": params}, _pad(src2), method=model.encode)
  np.testing.assert_allclose(enc[0, :4], alone1[0, :4], atol=1e-4)
  np.testing.assert_allclose(enc[0, 4:7], alone2[0, :3], atol=1e-4)
  np.testing.assert_allclose(logits[0, :3], model.apply(
      {"params": params}, _pad(src1), _pad(tgt1))[0, :3], atol=1e-4)
  # The reference shifts the whole row right (models.py L878-880), so the second
  # pair's first decoder input is the first pair's last target token, not 0.
  shifted = np.asarray(shift_right(jnp.asarray(_pad([tgt1[-1]] + tgt2))))[:, 1:]
  alone = model.apply({"params": params}, alone2, _pad(src2), _pad(shifted[0, :4].tolist()),
                      method=model.decode_logits)
  np.testing.assert_allclose(logits[0, 3:7], alone[0, :4], atol=1e-4)


def test_unpacked_records_get_one_segment_and_plain_positions(tmp_path):
  cfg = dataclasses.replace(_cfg(), data=dataclasses.replace(_cfg().data, packed=False))
  src, tgt = PAIRS[0]
  files = records.write_shards(str(tmp_path / "train-{index:05d}-of-{count:05d}"),
                               [{"inputs": np.asarray(src), "targets": np.asarray(tgt)}], 1)
  batch = _decoded(cfg, files, Split.TRAIN)
  assert list(batch["inputs_segmentation"][0, :5]) == [1, 1, 1, 1, 0]
  assert list(batch["targets_position"][0, :4]) == [0, 1, 2, 0]
  assert set(_decoded(cfg, files, Split.EVAL)) == {"inputs", "targets"}
  params, _ = WORKLOAD.init(cfg, jax.random.key(0))
  model = Transformer(cfg.model)
  packing = {k: batch[k] for k in input_pipeline.PACKING}
  np.testing.assert_allclose(
      model.apply({"params": params}, batch["inputs"], batch["targets"], packing=packing)[0, :3],
      model.apply({"params": params}, batch["inputs"], batch["targets"])[0, :3], atol=1e-4)


def test_each_data_form_has_its_true_epoch_size():
  # mlperf_input_pipeline.py L23 (N_TRAIN = 566340 packed records), L28 (N_EVAL = 3003).
  full = config.full()
  sched = WORKLOAD.schedule(full)
  assert full.data.packed and (sched.train_examples, sched.eval_examples) == (566_340, 3003)
  with pytest.raises(UserError, match="data.train_examples"):  # Before anything runs.
    dataclasses.replace(full.data, packed=False)
  counted = dataclasses.replace(full, data=dataclasses.replace(full.data, packed=False,
                                                               train_examples=4_500_966))
  assert WORKLOAD.schedule(counted).train_examples == 4_500_966
