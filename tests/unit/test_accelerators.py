"""The accelerator table: every figure present, sourced, and found by device kind."""

from __future__ import annotations

import pytest

from mlbench import accelerators

EXPECTED = {"tpu_v2", "tpu_v3", "tpu_v4", "tpu_v5e", "tpu_v5p", "tpu_v6e", "a100", "h100", "h200",
            "b200"}


def test_the_table_holds_every_accelerator_with_a_source():
  table = accelerators.table()
  assert set(table) >= EXPECTED
  for acc in table.values():
    assert acc.source.strip(), acc.name
    assert acc.peak_bf16_flops_per_s > 1e13 and acc.hbm_bytes > 8 * 2**30
    assert acc.hbm_bytes_per_s > 5e11 and acc.interconnect_bytes_per_s > 1e11


@pytest.mark.parametrize("kind, name", [
    ("TPU v2", "tpu_v2"), ("TPU v3", "tpu_v3"), ("TPU v4", "tpu_v4"), ("TPU v5 lite", "tpu_v5e"),
    ("TPU v5", "tpu_v5p"), ("TPU v5p", "tpu_v5p"), ("TPU v6 lite", "tpu_v6e"),
    ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H200", "h200"), ("NVIDIA B200", "b200")])
def test_device_kinds_name_their_accelerator(kind, name):
  assert accelerators.for_device_kind(kind).name == name


def test_a_cpu_has_no_entry():
  assert accelerators.for_device_kind("cpu") is None


def test_per_device_figures_split_the_chip_between_its_devices():
  v3 = accelerators.table()["tpu_v3"]
  assert v3.device_hbm_bytes == 16 * 2**30  # One TensorCore of a 32 GiB chip.
  assert v3.device_peak_flops_per_s == pytest.approx(61.5e12)
  v5p = accelerators.table()["tpu_v5p"]
  assert v5p.device_peak_flops_per_s == v5p.peak_bf16_flops_per_s
