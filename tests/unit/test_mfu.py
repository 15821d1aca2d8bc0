"""MFU: the devices' peak (table or measured) and the progress line that shows it."""

from __future__ import annotations

import io

import jax
import pytest
from rich.console import Console

from mlbench import accelerators
from mlbench.train import mfu
from mlbench.train.progress import RunProgress


def test_a_cpu_peak_is_this_hosts_measured_matmul_rate():
  p = mfu.peak(jax.devices("cpu"))
  assert p.flops_per_s > 1e8 and p.source.startswith("measured")


def test_an_accelerator_peak_comes_from_the_table():
  pytest.importorskip("libtpu")
  from mlbench.pod import topology

  devices = topology.devices(topology.parse("v5p-16"))
  p = mfu.peak(devices)
  assert p.flops_per_s == 8 * accelerators.table()["tpu_v5p"].peak_bf16_flops_per_s
  assert p.source == "8 x tpu_v5p dense bf16 peak"


def test_the_progress_line_shows_model_flops_and_mfu():
  out = io.StringIO()
  progress = RunProgress(title="resnet50", total_samples=100, train_examples=10,
                         console=Console(file=out, width=200))
  progress.utilization(flops_per_sample=2e9, peak_flops_per_s=1e12)
  progress.evaluated(4, "eval_accuracy", 0.5, 12.0, samples_per_s=100.0)
  line = out.getvalue()
  assert "100 samples/s  0.2 TFLOP/s, MFU 20.0%" in line
