"""What each published run did, read from its own implementation (benchmarks/calibration/
implementation.py over the lines kept in implementations.json), and the costing of a run
by the programs it ran (programs.py): a bucketed run as its buckets' programs."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from benchmarks.calibration import cases, implementation, programs
from mlbench import accelerators, registry
from mlbench.pod import costtable, timemodel

BUCKETED = "v2.0/Google/results/cloud-tpu-v4-8192-TF/bert"
PADDED = "v0.7/Google/results/tpu-v4-128-TF/bert"


def test_a_runs_padding_treatment_is_read_from_its_flags():
  """Google's v2.0 BERT on 4,096 chips bucketed by length (six buckets, a batch each, from
  run_bert_v4-8192.sh L42-53); the v0.7 BERT on 64 v4 chips padded to 512, one replica a
  TensorCore (--num_tpu_cores=128); NVIDIA unpadded, Dell packed two to a row."""
  b = implementation.of(BUCKETED)
  assert b.kind == "bucketed" and b.length == 512
  assert b.buckets == ((64, 14), (128, 8), (192, 5), (256, 4), (304, 3), (512, 2))
  assert b.replicas == 4096 and any(s.endswith("run_bert_v4-8192.sh") for s in b.sources)
  p = implementation.of(PADDED)
  assert (p.kind, p.length, p.buckets, p.replicas) == ("padded", 512, (), 128)
  assert implementation.of("v4.0/NVIDIA/results/eos_n8_ngc23.04_pytorch/bert").kind == "unpadded"
  dell = implementation.of("v4.0/Dell/results/XE9680x8H100-SXM-80GB/bert")
  assert (dell.kind, dell.per_replica, dell.sequences_per_row) == ("packed", 48, 2.0)
  assert implementation.of("v0.6/Google/results/tpu-v3-32/transformer").kind == "packed"
  # The rules as the code reads flags: one bucket is no bucketing (dataset_input.py L170-171).
  line = lambda text: {"file": "x", "line": 1, "text": text}
  one = [line("--max_seq_length=512 --seq_len_buckets=512 --batch_size_buckets=16")]
  assert implementation.read(one, "bert").kind == "padded"
  two = [line("--max_seq_length=512"), line("--seq_len_buckets=128"),
         line("--seq_len_buckets=512"), line("--batch_size_buckets=8"),
         line("--batch_size_buckets=2")]
  assert implementation.read(two, "bert").buckets == ((128, 8), (512, 2))
  with pytest.raises(ValueError, match="neither padding"):
    implementation.read([line("--learning_rate=1")], "bert")


def test_every_calibration_run_has_its_treatment_on_record():
  for case in cases.CASES + cases.GPU_CASES:
    impl = implementation.of(case.folder)
    want = "fixed" if case.benchmark in ("resnet", "ssd") else ("packed", "padded", "bucketed",
                                                                 "unpadded")
    assert impl.kind in want, case.name
    if case.benchmark in ("bert", "transformer"):
      assert impl.sources, case.name  # read from the run's own files, with their lines


def test_bucket_shares_by_hand():
  """Lengths 1-4 tokens, 10/20/30/40 sequences; buckets <= 2 (batch 4) and <= 4 (batch 1):
  30% and 70% of the sequences; a replica's steps 7.5 : 70."""
  shares = implementation.bucket_shares(((2, 4), (4, 1)), [10, 20, 30, 40])
  assert shares[0] == pytest.approx((0.3, 7.5 / 77.5))
  assert shares[1] == pytest.approx((0.7, 70 / 77.5))


def test_the_wikipedia_lengths_give_google_its_batch():
  """The published length histogram is half padding at 512 (Krell et al.), and Google's
  bucket batches on it average the 3.5 sequences a chip its logged batch says (14,336 on
  4,096 chips): the distribution and the bucket rule agree with the run."""
  counts = implementation.lengths()
  assert len(counts) == 512 and sum(counts) == 16_279_552
  assert 1 - implementation.mean_length(counts) / 512 == pytest.approx(0.50, abs=0.005)
  b = implementation.of(BUCKETED)
  per_step = sum(s / batch for (s, _), (_, batch) in
                 zip(implementation.bucket_shares(b.buckets, counts), b.buckets))
  assert 1 / per_step == pytest.approx(14336 / 4096, rel=0.02)


def test_a_bucketed_runs_cost_is_the_weighted_sum_of_its_buckets_costs():
  """Per device: each bucket's program (compiled at its length and batch) weighted by its
  share of a replica's steps, the shares counted here from the histogram; its step on one
  replica is the weighted sum of the buckets' step times, on 4,096 the slowest bucket's."""
  records = costtable.load()
  b = implementation.of(BUCKETED)
  wl = registry.get("bert")
  try:
    got = programs.train(records, "bert", b, 3.5, 1, wl, wl.configs["full"]())
  except KeyError:
    pytest.skip("the bucket programs are not in the cost table")
  counts = np.asarray(implementation.lengths())
  bounds = [0] + [n for n, _ in b.buckets]
  seqs = np.array([counts[lo:hi].sum() for lo, hi in itertools.pairwise(bounds)], float)
  steps = seqs / np.array([batch for _, batch in b.buckets])
  steps /= steps.sum()
  each = [costtable.device_cost(records, "bert", batch, 1, "train", None if n == 512 else n)
          for n, batch in b.buckets]
  for key in ("flops", "bytes"):
    assert got.cost[key] == pytest.approx(sum(q * c[key] for q, c in zip(steps, each)))
  assert [q for q, _ in got.mix] == pytest.approx(list(steps))
  acc = accelerators.table()["tpu_v4"]
  c = estimate_constants()
  x = timemodel.Inputs(devices=1, global_batch=4, peak_flops_per_s=acc.device_peak_flops_per_s,
                       hbm_bytes_per_s=acc.device_hbm_bytes_per_s,
                       train=timemodel.StepCost(got.cost["flops"], got.cost["bytes"]),
                       collective_s=0.0, steps=1, evals=0,
                       eval_batch_cost=timemodel.StepCost(0, 0), eval_batches=0,
                       model_flops_per_step=1.0, train_mix=got.mix, replicas=1)
  fixed = c.fixed_flops / acc.device_peak_flops_per_s
  times = [s.roofline_s(acc.device_peak_flops_per_s, acc.device_hbm_bytes_per_s, c.eta, c.hbm)
           for _, s in got.mix]
  one = timemodel.predict(x, c).device_step_s - fixed
  assert one == pytest.approx(sum(q * t for q, t in zip(steps, times)))
  many = timemodel.predict(dataclasses.replace(x, replicas=4096), c).device_step_s - fixed
  assert many == pytest.approx(max(times), rel=1e-6)


def estimate_constants() -> timemodel.Constants:
  return timemodel.Constants(eta=0.5, hbm=1.2, fixed_flops=1e11, warmup_s=0.0,
                             eval_overhead_s=0.0)


def test_the_slowest_of_many_replicas_by_hand():
  # Two programs, 1 s at share 3/4 and 2 s at 1/4: one replica 1.25 s; two: the slow one
  # unless both draw the fast (9/16): 1 + 7/16.
  pair = [(0.75, 1.0), (0.25, 2.0)]
  assert timemodel.slowest_of(pair, 1) == pytest.approx(1.25)
  assert timemodel.slowest_of(pair, 2) == pytest.approx(1 + 7 / 16)
  assert timemodel.slowest_of(pair, 10_000) == pytest.approx(2.0)


def test_v07_tpu_v4_runs_ran_a_replica_a_tensorcore():
  """--num_replicas=512 on 256 v4 chips: the calibration costs it as 512 devices of half a
  chip each (peak, bandwidth); v2.0's 4,096 replicas on 4,096 chips stay one a chip."""
  acc = accelerators.table()["tpu_v4"]
  v07 = programs.as_run(acc, implementation.of("v0.7/Google/results/tpu-v4-512-TF/resnet"), 256)
  assert v07.devices_per_chip == 2
  assert v07.device_peak_flops_per_s == acc.peak_bf16_flops_per_s / 2
  v20 = programs.as_run(acc, implementation.of("v2.0/Google/results/cloud-tpu-v4-8192-TF/resnet"),
                        4096)
  assert v20.devices_per_chip == 1
  megacore = programs.as_run(acc, implementation.of("v0.7/Google/results/tpu-v4-128-TF/resnet"),
                             64)
  assert megacore.devices_per_chip == 1  # --num_replicas=64 on 64 chips


def test_packed_and_unpadded_runs_are_costed_by_the_packed_program():
  """Dell's 48 packed rows a GPU, and NVIDIA's 72 unpadded sequences as the rows they fill
  at the data's mean length (72 x 255.8 / 512 = 36): the packed BERT program's compiles at
  those rows (a row of two sequences costs a little more than one padded sequence)."""
  records = costtable.load()
  wl = registry.get("bert")
  cfg = wl.configs["full"]()
  dell = implementation.of("v4.0/Dell/results/XE9680x8H100-SXM-80GB/bert")
  nvidia = implementation.of("v4.0/NVIDIA/results/eos_n8_ngc23.04_pytorch/bert")
  assert programs.rows_per_device(dell) == 48
  assert programs.rows_per_device(nvidia) == pytest.approx(72 * 255.83 / 512, rel=1e-3)
  got = programs.train(records, "bert", dell, 96, 1, wl, cfg)
  if got.stand_in:
    pytest.skip("the packed program is not in the cost table")
  packed = costtable.device_cost(records, "bert", 48, 1, "train", packed=True)
  padded = costtable.device_cost(records, "bert", 48, 1, "train")
  assert got.cost == packed and 1.0 < packed["flops"] / padded["flops"] < 1.05
