"""XLA's own run-time estimate of a compiled TPU program, read once and corrected here.

libtpu's cost analysis gives `optimal_seconds`, its estimate of one run of the
program. Two kinds of custom call in a compiled TPU program make the number wrong:

- "ConcatBitcast" is booked at -1 s each. XLA's memory-space assignment prefetches
  a buffer into the TPU's faster memory in slices and joins them with this custom
  call, a bitcast with no work of its own (openxla/xla,
  xla/service/memory_space_assignment/allocation.cc,
  SlicedCopyAllocation::CreateBitcastConcat; the slices' copies are costed as
  slice-start/slice-done). Found by comparing the estimates with the counts
  (libtpu 0.0.52): ResNet-50's train step on v4-128 holds 103 and its estimate is
  -102.965 s, its eval step 9 and -8.995 s, SSD's 142 and 141 and -141.941 s and
  -140.941 s (benchmarks/README.md, space-to-depth), BERT-large's 509 and 758 (padded,
  packed) and -508.603 s and -757.790 s (packed BERT), a reduced ResNet-50 on v4-8 18
  and -17.997 s, its eval step 2 and -1.9995 s. The other custom call in that eval
  step, GatherScatterIndicesBitpacked, is costed. So 1 s is added back for each.
  The estimate is a float32: near 103 it resolves about 8 us, so a corrected value
  under 100 of those steps is no estimate.
- "tpu_custom_call" (a Pallas/Mosaic kernel) without a `cost_estimate` in its
  backend config is counted as free (no FLOPs, no bytes; measured: a 512^3 matmul
  kernel plus an add is costed as the add alone). Such a program gets no estimate:
  its kernels' time is missing. A kernel that declares one is costed with it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from mlbench.pod import hlo

CONCAT_BITCAST = "ConcatBitcast"
PALLAS = "tpu_custom_call"
_CALL = re.compile(r'custom_call_target="(' + CONCAT_BITCAST + "|" + PALLAS + r')"')
_RESOLUTION_STEPS = 100  # a corrected estimate must be this many float32 steps of the raw one


@dataclasses.dataclass(frozen=True)
class CustomCalls:
  """The custom calls in a compiled program that libtpu's estimate misreads."""

  concat_bitcasts: int = 0
  uncosted_kernels: int = 0  # Pallas kernels without a cost estimate


@dataclasses.dataclass(frozen=True)
class Estimate:
  """XLA's estimate of a program: corrected (`seconds`, None where there is none), as
  libtpu gave it, how many -1 s ConcatBitcasts were added back, and a note (why none)."""

  seconds: float | None
  raw_seconds: float | None = None
  concat_bitcasts: int = 0
  note: str = ""


def cost_analysis(compiled: Any) -> dict[str, float]:
  """A compiled program's cost analysis as one dict (empty where the backend has none)."""
  try:
    cost = compiled.cost_analysis()
  except Exception:  # Not every backend implements cost analysis.
    return {}
  if isinstance(cost, list):
    cost = cost[0] if cost else {}
  return dict(cost or {})


def custom_calls(hlo_text: str) -> CustomCalls:
  """The ConcatBitcasts and cost-less Pallas kernels of an optimized HLO module's text."""
  bitcasts = kernels = 0
  for line in hlo_text.splitlines():
    m = _CALL.search(line)
    if m and m.group(1) == CONCAT_BITCAST:
      bitcasts += 1
    elif m and '"cost_estimate"' not in line:
      kernels += 1
  return CustomCalls(bitcasts, kernels)


def custom_calls_from_proto(serialized: bytes) -> CustomCalls:
  """`custom_calls` of a serialized HloModuleProto (where XLA cannot print the program)."""
  calls = [ins for comp in hlo.module_proto(serialized).computations
           for ins in comp.instructions if ins.opcode == "custom-call"]
  return CustomCalls(
      sum(ins.custom_call_target == CONCAT_BITCAST for ins in calls),
      sum(ins.custom_call_target == PALLAS and b'"cost_estimate"' not in ins.backend_config
          for ins in calls))


def estimate(optimal_seconds: float | None, calls: CustomCalls | None) -> Estimate:
  """libtpu's `optimal_seconds` corrected for the program's `calls` (None: unread)."""
  if optimal_seconds is None:
    return Estimate(None, note="XLA gave none")
  raw = float(optimal_seconds)
  if calls is None:  # The program could not be read: today's reading, said.
    return Estimate(raw if raw > 0 else None, raw,
                    note="its custom calls unread (XLA could not print the program)")
  n = calls.concat_bitcasts
  if calls.uncosted_kernels:
    return Estimate(None, raw, n, f"{calls.uncosted_kernels} Pallas kernels without a cost "
                                  "estimate, which the TPU compiler counts as free")
  seconds = raw + n
  # float32: the step between values near the raw estimate.
  step = math.ldexp(1.0, math.frexp(raw)[1] - 24) if raw else 0.0
  if seconds <= _RESOLUTION_STEPS * step:
    what = "still not positive" if seconds <= 0 else "below what its float32 resolves"
    return Estimate(None, raw, n, f"XLA gave {raw:.6g} s: {what} with its {n} "
                                  "ConcatBitcast calls' -1 s added back")
  return Estimate(seconds, raw, n, "")


def of_compiled(compiled: Any) -> Estimate:
  """XLA's corrected estimate of a compiled program whose text XLA can print."""
  return estimate(cost_analysis(compiled).get("optimal_seconds"),
                  custom_calls(compiled.as_text()))
