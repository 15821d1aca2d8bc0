"""--precision: full configs compute in bfloat16 on accelerators; CPUs keep the config's own."""

from __future__ import annotations

import jax
import pytest

from mlbench import registry
from mlbench.errors import UserError
from mlbench.train import plan
from mlbench.train.runtime import Runtime


def _runtime(devices):
  return Runtime(process_index=0, process_count=1, devices=devices, local_devices=devices)


def _dtype(cfg):
  return cfg.model.dtype.value


# The full configs are written in bfloat16 (as MLPerf submissions train them); a
# CPU keeps what the config says, and --precision asks for the other.
@pytest.mark.parametrize("name, own", [("resnet50", "bfloat16"), ("bert", "bfloat16"),
                                       ("transformer", "bfloat16"), ("ssd", "bfloat16")])
def test_a_cpu_keeps_the_configs_own_precision_unless_asked(name, own):
  cpu = _runtime(jax.devices("cpu"))
  cfg = registry.get(name).configs["full"]()
  other = {"float32": "bfloat16", "bfloat16": "float32"}[own]
  assert _dtype(plan._with_precision(cfg, "full", None, cpu)) == _dtype(cfg) == own
  assert _dtype(plan._with_precision(cfg, "full", other, cpu)) == other


def test_full_configs_default_to_bfloat16_on_a_tpu_and_float32_can_be_asked_for():
  pytest.importorskip("libtpu")
  from mlbench.pod import topology

  tpu = _runtime(topology.devices(topology.parse("v5e-4")))
  full = registry.get("resnet50").configs["full"]()
  assert _dtype(plan._with_precision(full, "full", None, tpu)) == "bfloat16"
  assert _dtype(plan._with_precision(full, "full", "float32", tpu)) == "float32"
  mini = registry.get("resnet50").configs["mini"]()  # Minis keep their own, everywhere.
  assert _dtype(plan._with_precision(mini, "mini", None, tpu)) == "float32"


def test_a_config_without_a_model_dtype_refuses_precision():
  import dataclasses

  @dataclasses.dataclass(frozen=True)
  class Bare:
    lr: float = 1.0

  with pytest.raises(UserError, match="model.dtype"):
    plan._with_precision(Bare(), "full", "bfloat16", _runtime(jax.devices("cpu")))
