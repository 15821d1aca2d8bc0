"""Packed BERT (workloads/bert/packing.py): packed rows train exactly what the same sequences
padded one a row train, no sequence sees another, and the packer keeps every sequence whole,
each once, in the order the run's seed shuffled.

One tiny float32 BERT (the mini's, 2 layers of 128, dropout off) and one set of sequences
serve the model tests; the packer runs on NumPy alone and over the real mini TFRecords.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
from pathlib import Path

import jax
import numpy as np
import pytest

from mlbench import config as config_lib
from mlbench.errors import UserError
from mlbench.fields import AttentionImpl
from mlbench.train import attention, data
from mlbench.workload import Split, StepContext
from workloads.bert import WORKLOAD, config, input_pipeline, model, packing

PACKED = ("data.max_sequences_per_row=4", "data.packing_factor=2.0")
WIKIPEDIA = Path(__file__).parents[2] / "benchmarks" / "bert_wikipedia_lengths.json"


@pytest.fixture(scope="module")
def cfg():
  """The mini config, packing up to 4 sequences into rows of 64 tokens."""
  return config_lib.override(config.mini(), list(PACKED))


@pytest.fixture(scope="module")
def sequences(cfg):
  """Twelve decoded records of 6 to 40 tokens (15% masked), as the reader yields them."""
  rng = np.random.default_rng(7)
  lengths = rng.integers(6, 41, 12)
  masked = np.maximum(1, np.round(0.15 * lengths)).astype(np.int64)
  return input_pipeline._examples(cfg, lengths, masked, rng)


@pytest.fixture(scope="module")
def placement(cfg, sequences):
  """(row, slot of each sequence, rows used): `sequences` packed best fit."""
  lengths = np.array([int(s["input_mask"].sum()) for s in sequences])
  row, slot, used = packing.best_fit_decreasing(
      lengths, np.array([int(s["masked_lm_weights"].sum()) for s in sequences]),
      input_pipeline.row_shape(cfg))
  assert used < len(sequences) and np.bincount(row).max() > 1  # really packed
  return row, slot, used


@pytest.fixture(scope="module")
def both(cfg, sequences, placement):
  """(packed rows, the same sequences padded one a row) of `sequences`."""
  packed = packing.build(sequences, *placement, input_pipeline.row_shape(cfg))
  padded = {k: np.stack([s[k] for s in sequences]) for k in sequences[0]}
  return packed, padded


@pytest.fixture(scope="module")
def params(cfg):
  return jax.jit(lambda key: WORKLOAD.init(cfg, key)[0])(jax.random.key(0))


@functools.cache
def _loss_and_grads(cfg):
  def loss(p, batch):
    value, (_, metrics) = WORKLOAD.loss(cfg, StepContext(mesh=None), p, {}, batch,
                                        jax.random.key(1))
    return value, metrics
  return jax.jit(jax.value_and_grad(loss, has_aux=True))


def test_packed_rows_give_the_losses_and_gradients_of_the_sequences_padded(cfg, both, params):
  packed, padded = both
  (loss_p, metrics_p), grads_p = _loss_and_grads(cfg)(params, packed)
  (loss_u, metrics_u), grads_u = _loss_and_grads(cfg)(params, padded)
  assert cfg.model.dtype.value == "float32" and cfg.model.dropout == 0.0
  np.testing.assert_allclose(loss_p, loss_u, rtol=2e-6)
  for name in ("mlm_accuracy", "nsp_loss"):
    np.testing.assert_allclose(metrics_p[name], metrics_u[name], rtol=2e-6, err_msg=name)
  flat_p, flat_u = jax.tree.leaves_with_path(grads_p), jax.tree.leaves(grads_u)
  # Relative to the largest gradient entry: the key biases' gradients are 0 but for
  # rounding (softmax ignores a constant added to a query's every logit).
  scale = max(float(np.abs(g).max()) for g in flat_u)
  for (path, g_p), g_u in zip(flat_p, flat_u):
    np.testing.assert_allclose(np.asarray(g_p) / scale, np.asarray(g_u) / scale, atol=1e-6,
                               err_msg=jax.tree_util.keystr(path))


def test_attention_dropout_on_packed_rows_is_the_padded_sequences(both, placement):
  """The XLA attention with dropout that packed training runs (segment ids) against the same
  sequences padded (lengths), under one dropout mask per sequence laid out in both, so the
  outputs and gradients compare exactly (the model test above runs dropout 0)."""
  packed, padded = both
  row, _, _ = placement
  lengths = padded["input_mask"].sum(-1)
  starts = packed["cls_positions"][row, placement[1]]
  rate, heads, size, length = 0.1, 2, 8, packed["input_ids"].shape[1]
  rng = np.random.default_rng(5)
  q, k, v, cot = (rng.normal(size=(len(lengths), length, heads, size)).astype(np.float32)
                  for _ in range(4))
  keep = rng.random((len(lengths), heads, length, length)) > rate  # per sequence, at its start
  where = [(i, slice(0, n), r, slice(o, o + n))
           for i, (n, r, o) in enumerate(zip(lengths, row, starts))]

  def lay_out(x, rows, keep_mask=False):  # each sequence's [:n] at its packed row and start
    out = np.ones((rows, heads, length, length), bool) if keep_mask else np.zeros(
        (rows, *x.shape[1:]), x.dtype)
    for i, own, r, at in where:
      if keep_mask:
        out[r, :, at, at] = x[i, :, own, own]
      else:
        out[r, at] = x[i, own]
    return out

  def attend(q, k, v, cot, keep_mask, masks):
    drop = attention.Dropout(rate, jax.random.key(0),  # XLA applies `apply`, not the key
                             apply=lambda p: p * keep_mask / (1 - rate))
    out = attention.attend(q, k, v, name="test", dropout=drop, **masks)
    return (out * cot).sum(), out

  step = jax.jit(jax.value_and_grad(attend, argnums=(0, 1, 2), has_aux=True))
  ids = packed["sequence_ids"]
  with attention.recording() as used:
    (_, out_p), grads_p = step(*(lay_out(x, len(ids)) for x in (q, k, v, cot)),
                               lay_out(keep, len(ids), True),
                               {"q_segments_BL": ids, "kv_segments_BS": ids})
  (_, out_u), grads_u = step(q, k, v, np.where(padded["input_mask"][..., None, None] > 0, cot, 0),
                             keep, {"kv_lengths_B": lengths})
  [call] = used
  assert call.choice.implementation is AttentionImpl.XLA and call.site.packed
  assert call.site.dropout == rate
  for i, own, r, at in where:
    np.testing.assert_allclose(np.asarray(out_p)[r, at], np.asarray(out_u)[i, own], rtol=1e-5,
                               atol=1e-6)
    for g_p, g_u in zip(grads_p, grads_u):
      np.testing.assert_allclose(np.asarray(g_p)[r, at], np.asarray(g_u)[i, own], rtol=1e-5,
                                 atol=1e-6)


def _outputs(cfg, params, batch):
  return jax.jit(lambda p, b: model.Bert(cfg.model).apply({"params": p}, b))(params, batch)


def test_changing_one_sequence_leaves_its_row_mates_outputs_unchanged(cfg, both, params):
  packed, _ = both
  row = int(np.argmax(packed["next_sentence_weights"].sum(-1)))
  assert packed["next_sentence_weights"][row].sum() >= 2
  changed = {k: v.copy() for k, v in packed.items()}
  mine = packed["sequence_ids"][row] == 1  # slot 0's tokens
  changed["input_ids"][row, mine] = (changed["input_ids"][row, mine] + 7) % cfg.model.vocab_size
  mlm, nsp = _outputs(cfg, params, packed)
  mlm2, nsp2 = _outputs(cfg, params, changed)
  # Every masked position of the row belongs to one sequence: those of slot 0 must change,
  # the others must not (nor any other row, nor the other slots' next-sentence logits).
  at = packed["sequence_ids"][row][packed["masked_lm_positions"][row]]
  real = packed["masked_lm_weights"][row] > 0
  others = real & (at != 1)
  assert others.any()
  np.testing.assert_array_equal(np.asarray(mlm2)[row, others], np.asarray(mlm)[row, others])
  assert not np.allclose(np.asarray(mlm2)[row, real & (at == 1)],
                         np.asarray(mlm)[row, real & (at == 1)])
  mates = np.flatnonzero(packed["next_sentence_weights"][row] > 0)[1:]  # (empty slots read 0)
  np.testing.assert_array_equal(np.asarray(nsp2)[row, mates], np.asarray(nsp)[row, mates])
  assert not np.allclose(np.asarray(nsp2)[row, 0], np.asarray(nsp)[row, 0])
  keep = np.arange(len(packed["input_ids"])) != row
  np.testing.assert_array_equal(np.asarray(mlm2)[keep], np.asarray(mlm)[keep])


def _stream(cfg, count: int, seed: int):
  """`count` records with ids 0, 1, ... in their first token after [CLS] (lengths skewed
  like Wikipedia's: a quarter full, the rest short), in chunks of 16."""
  rng = np.random.default_rng(seed)
  length = cfg.data.max_seq_length
  lengths = np.where(rng.random(count) < 0.25, length, rng.integers(6, length // 2, count))
  masked = np.minimum(cfg.data.max_predictions_per_seq,
                      np.maximum(1, np.round(0.15 * lengths))).astype(np.int64)
  examples = input_pipeline._examples(cfg, lengths, masked, rng)
  for i, ex in enumerate(examples):
    ex["input_ids"][1] = 5 + i  # who it is, never masked (masked copies sit >= position 2)
    ex["masked_lm_positions"][ex["masked_lm_positions"] == 1] = 0
  for start in range(0, count, 16):
    part = examples[start:start + 16]
    yield {k: np.stack([e[k] for e in part]) for k in part[0]}, part


def _sequences_of(batch):
  """{record id: (tokens, masked ids)} of every sequence in a packed batch, read back by
  its sequence ids (whole and contiguous, or the test fails)."""
  out = {}
  for r in range(len(batch["input_ids"])):
    ids = batch["sequence_ids"][r]
    for s in range(1, ids.max() + 1):
      where = np.flatnonzero(ids == s)
      assert len(where) and (np.diff(where) == 1).all()  # contiguous
      start = int(batch["cls_positions"][r, s - 1])
      assert start == where[0] and batch["position_ids"][r, where[0]] == 0
      in_span = np.isin(batch["masked_lm_positions"][r], where) & (
          batch["masked_lm_weights"][r] > 0)
      out[int(batch["input_ids"][r, start + 1]) - 5] = (
          batch["input_ids"][r, where], batch["masked_lm_ids"][r, in_span])
  return out


def test_the_packer_keeps_every_sequence_whole_once_and_in_its_rows_limits():
  cfg = config_lib.override(config.mini(), ["data.max_sequences_per_row=3",
                                            "data.packing_factor=1.6"])
  shape = input_pipeline.row_shape(cfg)
  examples, rows, steps = 48, 26, 12
  chunks = list(_stream(cfg, examples * steps + 400, seed=3))
  originals = [ex for _, part in chunks for ex in part]
  packer = input_pipeline.pack(cfg, examples, rows)
  seen: dict[int, int] = {}
  for step, batch in enumerate(itertools.islice(packer(c for c, _ in chunks), steps)):
    assert batch["input_ids"].shape == (rows, shape.length)
    assert batch["next_sentence_weights"].sum() == examples  # exactly the step's sequences
    assert (batch["next_sentence_weights"].sum(-1) <= shape.max_per_row).all()
    assert (batch["input_mask"].sum(-1) <= shape.length).all()
    for i, (tokens, masked) in _sequences_of(batch).items():
      assert i not in seen  # never twice
      seen[i] = step
      ex = originals[i]
      n = int(ex["input_mask"].sum())
      np.testing.assert_array_equal(tokens, ex["input_ids"][:n])  # whole, never split
      np.testing.assert_array_equal(masked, ex["masked_lm_ids"][ex["masked_lm_weights"] > 0])
  _each_once_in_order(seen, examples, steps)
  assert max(packer.waits) >= 1  # some did wait: the test exercised the exchanges


def _each_once_in_order(seen: dict[int, int], examples: int, steps: int) -> None:
  """`seen` ({record id: step}, each id once) holds every id below the stream's frontier, and
  none trails its place in the shuffled order (id // examples) by more than MAX_DEFERRALS
  steps. The frontier: after `steps` steps every sequence of steps up to
  steps - 1 - MAX_DEFERRALS must have gone in, so one missing there was dropped."""
  frontier = (steps - packing.MAX_DEFERRALS) * examples
  missing = sorted(set(range(frontier)) - set(seen))
  assert not missing, f"dropped: {missing[:10]}"
  late = {i: step - i // examples for i, step in seen.items()}
  assert max(late.values()) <= packing.MAX_DEFERRALS, max(late.items(), key=lambda x: x[1])


def test_no_sequence_trails_its_place_by_more_than_the_bound_on_wikipedias_lengths():
  """The full config's packer (8 a row, 1.95 a row) at 64 sequences a host on MLPerf
  Wikipedia's lengths (benchmarks/bert_wikipedia_lengths.json): a packer that counted waits
  from the queue's head let some trail by 5 steps in these 60 (1.9% by 5 or 6 in 3,000)."""
  hist = np.array(json.loads(WIKIPEDIA.read_text())["counts"])
  shape = input_pipeline.row_shape(config.full())  # 512 tokens, 8 sequences, 83 masked a row
  examples, steps = 64, 60
  rng = np.random.default_rng(11)
  lengths = rng.choice(np.arange(1, len(hist) + 1), examples * steps + 400, p=hist / hist.sum())
  stream = [{"input_mask": (np.arange(shape.length) < n).astype(np.int32),
             "masked_lm_weights": (np.arange(76) < max(1, round(0.15 * n))).astype(np.float32),
             "id": np.int64(i)} for i, n in enumerate(lengths)]
  chunks = ({k: np.stack([e[k] for e in stream[i:i + 64]]) for k in stream[0]}
            for i in range(0, len(stream), 64))
  packer = packing.Packer(shape, examples=examples, rows=int(np.ceil(examples / 1.95)),
                          lookahead=256)
  seen: dict[int, int] = {}
  for step, (chosen, _, _) in enumerate(itertools.islice(packer.steps(chunks), steps)):
    for ex in chosen:
      assert int(ex["id"]) not in seen
      seen[int(ex["id"])] = step
  _each_once_in_order(seen, examples, steps)
  assert packer.waits[packing.MAX_DEFERRALS] > 0  # the bound was reached and held


def test_a_packing_factor_the_data_cannot_reach_is_a_one_line_error():
  cfg = config_lib.override(config.mini(), ["data.max_sequences_per_row=2",
                                            "data.packing_factor=2.0"])
  rng = np.random.default_rng(0)
  long = input_pipeline._examples(cfg, np.full(64, 40), np.full(64, 6), rng)  # 2 never fit
  chunk = {k: np.stack([e[k] for e in long]) for k in long[0]}
  with pytest.raises(UserError, match="smaller data.packing_factor"):
    next(input_pipeline.pack(cfg, 32, 16)(iter([chunk] * 8)))


def _first_batches(cfg, files, seed: int, count: int = 2):
  examples, rows = 64, 63  # the mini's data is 3.9% padding: 64 in 61.5 rows at best
  ds = data.train_dataset(files, input_pipeline.decode(cfg, Split.TRAIN),
                          per_host_batch=examples, seed=seed, host=0, hosts=1,
                          pack=input_pipeline.pack(cfg, examples, rows))
  return list(itertools.islice(data.numpy_batches(ds), count))


def test_packed_batches_of_the_real_pipeline_follow_the_run_seed(bert_data_dir):
  cfg = config_lib.override(config.mini(), ["data.max_sequences_per_row=3",
                                            "data.packing_factor=1.02"])
  files = input_pipeline.files(cfg, bert_data_dir, Split.TRAIN)
  a, again, b = (_first_batches(cfg, files, s) for s in (0, 0, 1))
  for x, y in zip(a, again):  # the same seed, the same batches
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])
  assert all(x["next_sentence_weights"].sum() == 64 for x in a + b)
  assert (np.asarray([x["next_sentence_weights"].sum(-1) for x in a]) > 1).any()  # packed
  assert not np.array_equal(a[0]["input_ids"], b[0]["input_ids"])  # another seed, another order
  # A resumed run skips batches by packing them: the second batch, after one skipped.
  resumed = data.train_dataset(files, input_pipeline.decode(cfg, Split.TRAIN),
                               per_host_batch=64, seed=0, host=0, hosts=1, skip_batches=1,
                               pack=input_pipeline.pack(cfg, 64, 63))
  np.testing.assert_array_equal(next(data.numpy_batches(resumed))["input_ids"],
                                a[1]["input_ids"])


def test_packing_sizes_the_step_and_its_flops_from_the_factor():
  full = config.full()
  sched = WORKLOAD.schedule(full)
  assert sched.packing.max_per_row == 8 and sched.rows() == 4202  # ceil(8192 / 1.95)
  padded = config_lib.override(full, ["data.max_sequences_per_row=1"])
  assert WORKLOAD.schedule(padded).packing is None and WORKLOAD.schedule(padded).rows() == 8192
  # A packed row costs a padded sequence's layers (its masked-LM head at 83 positions, its
  # pooler at 8 slots, against 76 and 1) and holds 1.95 sequences.
  per_row = WORKLOAD.flops_per_example(full) * 1.95
  h, v = 1024, 30522
  heads = 6 * ((83 - 76) * h * (h + v) + (8 - 1) * h * (h + 2))
  assert per_row - WORKLOAD.flops_per_example(padded) == pytest.approx(heads, rel=1e-9)
  with pytest.raises(UserError, match="packing_factor"):
    config_lib.override(full, ["data.packing_factor=9"])
  assert dataclasses.replace(full.data, max_sequences_per_row=1, packing_factor=9).packed is False


def test_a_run_plan_rounds_the_rows_up_to_split_over_its_devices(tmp_path):
  from mlbench.config import RunConfig
  from mlbench.train.plan import make_plan
  from mlbench.train.runtime import Runtime

  for count, sets, rows in ((8, (), 56),  # 96 / 1.95 = 49.2 rows -> 7 on each of 8 devices
                            (4, (), 52),
                            (8, ("data.max_sequences_per_row=1",), 96)):
    devices = jax.devices()[:count]
    rc = RunConfig(workload="bert", config="full", overrides=("global_batch_size=96", *sets),
                   results_dir=tmp_path)
    plan = make_plan(rc, Runtime(0, 1, devices, devices))
    assert plan.schedule.rows() == rows and plan.gbs == 96
    assert plan.hparams["global_batch_size"] == 96  # MLPerf's batch: sequences a step
