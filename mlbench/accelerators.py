"""Accelerator specifications as data: peak FLOP/s, HBM and interconnect per chip.

The figures live in `accelerators.yaml` beside this module, each with its
source. `mlbench check` compares a compiled program against them (memory
against HBM, a roofline step time) and a run reports its MFU against the
device's peak. Per-device values divide by `devices_per_chip`: TPU v2 and v3
show each TensorCore to JAX as a device with half the chip.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from importlib import resources
from typing import Any

import yaml


@dataclasses.dataclass(frozen=True)
class Accelerator:
  """One accelerator model, per chip as published (see accelerators.yaml for units)."""

  name: str
  platform: str
  device_kinds: tuple[str, ...]
  devices_per_chip: int
  peak_bf16_flops_per_s: float
  hbm_bytes: int
  hbm_bytes_per_s: float
  interconnect_bytes_per_s: float
  source: str
  host_cores_per_chip: float = 0.0
  ici: dict[str, Any] = dataclasses.field(default_factory=dict)  # see accelerators.yaml

  @property
  def device_peak_flops_per_s(self) -> float:
    """Dense bf16 peak of one JAX device."""
    return self.peak_bf16_flops_per_s / self.devices_per_chip

  @property
  def device_hbm_bytes(self) -> int:
    """HBM one JAX device owns."""
    return self.hbm_bytes // self.devices_per_chip

  @property
  def device_hbm_bytes_per_s(self) -> float:
    return self.hbm_bytes_per_s / self.devices_per_chip

  @property
  def device_interconnect_bytes_per_s(self) -> float:
    return self.interconnect_bytes_per_s / self.devices_per_chip

  def matches(self, device_kind: str) -> bool:
    return any(re.search(p, device_kind) for p in self.device_kinds)


@functools.cache
def _document() -> dict[str, Any]:
  return yaml.safe_load(resources.files("mlbench").joinpath("accelerators.yaml").read_text())


@functools.cache
def table() -> dict[str, Accelerator]:
  """Every accelerator in accelerators.yaml, by name."""
  return {name: _entry(name, raw) for name, raw in _document().items() if name != "time_model"}


def time_model(platform: str) -> dict[str, Any]:
  """The fitted constants of the pod time model for a platform ('tpu', 'gpu') and their
  provenance (accelerators.yaml, `time_model`); empty where none were fitted."""
  return dict((_document().get("time_model") or {}).get(platform) or {})


def _entry(name: str, raw: dict[str, Any]) -> Accelerator:
  return Accelerator(name=name, platform=str(raw["platform"]),
                     device_kinds=tuple(raw["device_kinds"]),
                     devices_per_chip=int(raw["devices_per_chip"]),
                     peak_bf16_flops_per_s=float(raw["peak_bf16_flops_per_s"]),
                     hbm_bytes=int(raw["hbm_bytes"]), hbm_bytes_per_s=float(raw["hbm_bytes_per_s"]),
                     interconnect_bytes_per_s=float(raw["interconnect_bytes_per_s"]),
                     source=str(raw["source"]),
                     host_cores_per_chip=float(raw.get("host_cores_per_chip", 0)),
                     ici=dict(raw.get("ici") or {}))


def for_device_kind(device_kind: str) -> Accelerator | None:
  """The accelerator a `jax.Device.device_kind` names, or None (a CPU, an unlisted chip)."""
  for acc in table().values():
    if acc.matches(device_kind):
      return acc
  return None
