"""The programs a published run ran, costed from mlbench's compiles (the package's cost table).

What each run did comes from its own implementation (`implementation.py`):

- its replica layout: the v0.7 TPU v4 runs ran each TensorCore as its own replica
  (`--num_replicas=512` on 256 chips: two devices a chip, each at half the chip's peak
  and bandwidth, each updating its own copy of the weights), where mlbench and the v2.0
  runs use the chip as one device (megacore);
- a length-bucketed run (v2.0 BERT on 4,096 chips) ran one program per bucket, a
  bucket's batch of sequences sliced to the bucket's length: each costed by mlbench's
  program compiled at that length and batch, weighted by its share of a replica's steps
  for the sequence lengths of MLPerf's Wikipedia data (`implementation.bucket_shares`);
  its step waits for the slowest replica (`timemodel.slowest_of`);
- a packed or unpadded run (NVIDIA's and Dell's v4.0 BERT) does the work of rows of 512
  tokens holding about two sequences each: costed by the packed BERT program where the
  cost table has it (records marked `packed`), else by the padded program at the same
  rows a device, said as a stand-in (`Train.stand_in`), and not fitted on;
- everything else (padded BERT, the packed Transformer, images): mlbench's full program
  at the run's per-device batch, as before.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mlbench import accelerators
from mlbench.pod import costtable
from mlbench.pod.timemodel import StepCost

from .implementation import Implementation, bucket_shares, lengths, mean_length

PACKED_STAND_IN = ("the packed BERT program (issue 47) is not in the cost table: the padded "
                   "512-token program at the run's rows a device stands in")


@dataclasses.dataclass(frozen=True)
class Train:
  """A run's train step per device: the mean figures (flops, bytes, params, ...), the mix
  of programs its replicas draw from (empty: one program), the analytic model FLOPs of a
  replica's step, and why a stand-in costs it ("" where its own program does)."""

  cost: dict[str, float]
  mix: tuple[tuple[float, StepCost], ...] = ()
  model_flops_per_replica: float | None = None
  stand_in: str = ""


def as_run(acc: accelerators.Accelerator, impl: Implementation, chips: int
           ) -> accelerators.Accelerator:
  """The accelerator as the run used it: as many devices a chip as its flags put there."""
  used = impl.devices()
  if used is None or used == chips * acc.devices_per_chip or used % chips:
    return acc
  return dataclasses.replace(acc, devices_per_chip=used // chips)


def split(cost: dict[str, float], model: int) -> dict[str, float]:
  """A device's share of FLOPs, bytes and parameters with `model`-way model parallelism."""
  return {k: v / model for k, v in cost.items()}


def _length_cfg(cfg: Any, seq: int) -> Any:
  data = dataclasses.replace(cfg.data, max_seq_length=seq,
                             max_predictions_per_seq=min(cfg.data.max_predictions_per_seq,
                                                         seq - 2))
  return dataclasses.replace(cfg, data=data)


def train(records: dict[str, dict[str, Any]], workload: str, impl: Implementation,
          per_device: float, model: int, wl: Any, cfg: Any) -> Train:
  """The train step a device of the run ran (`per_device`: the logged batch over the data
  devices)."""
  if workload == "bert" and impl.kind in ("packed", "unpadded"):
    return _packed(records, impl, wl, cfg)
  if workload == "bert" and impl.kind == "bucketed":
    return _bucketed(records, impl, wl, cfg)
  return Train(split(costtable.device_cost(records, workload, per_device, 1, "train"), model))


def padded_cfg(cfg: Any) -> Any:
  """A BERT config as the padded runs ran: one sequence a row (the full config packs)."""
  if not hasattr(cfg.data, "max_sequences_per_row"):
    return cfg
  return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, max_sequences_per_row=1))


def _bucketed(records: dict[str, dict[str, Any]], impl: Implementation, wl: Any, cfg: Any
              ) -> Train:
  shares = bucket_shares(impl.buckets, lengths())
  full = cfg.data.max_seq_length
  costs = [costtable.device_cost(records, "bert", batch, 1, "train",
                                 None if seq == full else seq) for seq, batch in impl.buckets]
  mean = {k: sum(step * c[k] for (_, step), c in zip(shares, costs)) for k in costs[0]}
  mix = tuple((step, StepCost(c["flops"], c["bytes"])) for (_, step), c in zip(shares, costs))
  flops = sum(step * batch * float(wl.flops_per_example(_length_cfg(padded_cfg(cfg), seq)))
              for (_, step), (seq, batch) in zip(shares, impl.buckets))
  return Train(mean, mix, model_flops_per_replica=flops)


def rows_per_device(impl: Implementation) -> float:
  """Rows of `impl.length` tokens a device computes: the packed rows, or an unpadded run's
  sequences at the data's mean length (MLPerf's Wikipedia data: 255.8 of 512 tokens)."""
  if impl.kind == "packed":
    return float(impl.per_replica or 0)
  return (impl.per_replica or 0) * mean_length(lengths()) / impl.length


def _packed(records: dict[str, dict[str, Any]], impl: Implementation, wl: Any, cfg: Any
            ) -> Train:
  rows = rows_per_device(impl)
  packed = any(r["workload"] == "bert" and r.get("packed") for r in records.values())
  # Issue 47's packed program, compiled at a packing factor of 2 (costs.py), costs the rows;
  # where the table has none, a padded sequence stands in for a row.
  cost = costtable.device_cost(records, "bert", rows, 1, "train", packed=packed)
  sequences = (impl.per_replica or 0) * (impl.sequences_per_row or 1.0)
  return Train(cost, model_flops_per_replica=sequences * float(wl.flops_per_example(cfg)),
               stand_in="" if packed else PACKED_STAND_IN)
