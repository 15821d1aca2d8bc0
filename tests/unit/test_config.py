"""Config loading and typed dotted overrides."""

from __future__ import annotations

import pytest

from mlbench import config as config_lib
from mlbench.errors import UserError
from workloads.resnet50 import WORKLOAD
from workloads.resnet50.config import Optimizer, Stem


def mini():
  return WORKLOAD.configs["mini"]()


def test_overrides_are_parsed_as_the_declared_types():
  base = mini()
  cfg = config_lib.override(base, [
      "global_batch_size=256", "optimizer.base_learning_rate=2.5", "optimizer.name=sgd",
      "model.stem=imagenet", "model.stage_sizes=2,2,2,2", "data.crop_area=(0.3, 1.0)",
      "data.flip=true", "train_epochs=7"])
  assert cfg.global_batch_size == 256
  assert cfg.optimizer.base_learning_rate == 2.5
  assert cfg.optimizer.name is Optimizer.SGD
  assert cfg.model.stem is Stem.IMAGENET
  assert cfg.model.stage_sizes == (2, 2, 2, 2)
  assert cfg.data.crop_area == (0.3, 1.0)
  assert cfg.data.flip is True
  assert cfg.train_epochs == 7.0
  # Untouched fields keep the config's values; the original is not mutated.
  assert cfg.model.width == base.model.width
  assert base == mini() and base.global_batch_size != 256


@pytest.mark.parametrize("assignment, message", [
    ("global_batch_sise=3", "unknown config key 'global_batch_sise'; valid keys here: data, "
                            "eval_batch_size, eval_offset_epochs, global_batch_size, model, "
                            "optimizer, train_epochs"),
    ("optimizer.lr=1", "unknown config key 'optimizer.lr'"),
    ("optimizer=1", "config key 'optimizer' is a section; set one of: optimizer.name"),
    ("global_batch_size=big", "global_batch_size must be an int; got 'big'"),
    ("optimizer.name=adam", "optimizer.name must be one of: lars, sgd; got 'adam'"),
    ("data.flip=maybe", "data.flip must be true or false"),
    ("data.crop_area=0.5", "data.crop_area needs 2 comma-separated values"),
    ("no_equals_sign", "--set expects KEY=VALUE, got 'no_equals_sign'"),
    ("model.width.x=1", "'width' is a value, not a section"),
])
def test_bad_overrides_name_the_problem_and_the_choices(assignment, message):
  with pytest.raises(UserError) as e:
    config_lib.override(mini(), [assignment])
  assert message in str(e.value)
  assert "\n" not in str(e.value)


def test_config_by_name_and_from_a_python_file(tmp_path):
  name, cfg = config_lib.load(WORKLOAD, None)
  assert name == "mini" and cfg == mini()
  path = tmp_path / "wide.py"
  path.write_text("import dataclasses\nfrom workloads.resnet50 import config\n"
                  "def get_config():\n"
                  "  c = config.mini()\n"
                  "  return dataclasses.replace(c, global_batch_size=512)\n")
  name, cfg = config_lib.load(WORKLOAD, str(path))
  assert name == "wide" and cfg.global_batch_size == 512


@pytest.mark.parametrize("content, message", [
    (None, "does not exist"),
    ("x = 1\n", "has no get_config()"),
    ("def get_config():\n  return 3\n", "get_config() returned int, expected"),
    ("raise ValueError('boom')\n", "failed to load: ValueError: boom"),
])
def test_bad_config_files_are_one_line_errors(tmp_path, content, message):
  path = tmp_path / "c.py"
  if content is not None:
    path.write_text(content)
  with pytest.raises(UserError, match=None) as e:
    config_lib.load(WORKLOAD, str(path))
  assert message in str(e.value)


def test_unknown_config_name_lists_the_configs():
  with pytest.raises(UserError) as e:
    config_lib.load(WORKLOAD, "huge")
  assert "unknown config 'huge' for resnet50; choose one of: full, mini" in str(e.value)


def test_flatten_lists_every_leaf_with_enum_values():
  flat = config_lib.flatten(mini())
  assert flat["optimizer.name"] == "lars"
  assert flat["model.stage_sizes"] == (1, 1, 1, 1)
  import dataclasses
  cfg = mini()
  leaves = sum(len(dataclasses.fields(getattr(cfg, s))) for s in ("model", "data", "optimizer"))
  # + the two batch sizes, train_epochs and eval_offset_epochs.
  assert "model" not in flat and len(flat) == leaves + 4


def test_a_config_checks_its_combinations_once_all_overrides_are_in():
  """Each section is built once with every --set value it gets, so the order of the
  assignments does not matter, and a bad combination names the full key."""
  from mlbench.fields import ConfigError
  from workloads.llama31_8b import config as llama

  both = ("model.attention_chunk=128", "data.seq_length=512")
  for order in (both, both[::-1]):
    cfg = config_lib.override(llama.mini(), order)
    assert (cfg.model.attention_chunk, cfg.data.seq_length) == (128, 512)
  with pytest.raises(ConfigError, match=r"^model\.attention_chunk: 100 does not divide "
                                        r"data\.seq_length \(256\); set 0"):
    config_lib.override(llama.mini(), ["model.attention_chunk=100"])
  with pytest.raises(ConfigError, match=r"^model\.rope\.high_freq_factor: 0\.5 is not above "
                                        r"model\.rope\.low_freq_factor \(1\.0\)"):
    config_lib.override(llama.mini(), ["model.rope.high_freq_factor=0.5"])


def test_every_config_of_every_workload_passes_its_own_checks():
  from mlbench import registry
  from mlbench.fields import WorkloadConfig

  for w in registry.all_workloads():
    for make in w.configs.values():
      cfg = config_lib.override(make(), [])  # built by its function: its checks ran once
      assert isinstance(cfg, WorkloadConfig), w.name  # the shared sections and batch checks


def test_the_shared_top_checks_the_batch_sizes_and_epochs_of_every_workload():
  """`WorkloadConfig` and `EpochConfig` check the fields every workload has, under their
  `--set` keys, whichever workload's config extends them."""
  from mlbench.fields import ConfigError
  from workloads.bert import config as bert
  from workloads.vit import config as vit

  for cfg in (bert.mini(), vit.mini(), mini()):
    with pytest.raises(ConfigError, match=r"^eval_batch_size: 0 is below 1; set 1 or more"):
      config_lib.override(cfg, ["eval_batch_size=0"])
  with pytest.raises(ConfigError, match=r"^train_epochs: -1\.0 is not positive"):
    config_lib.override(vit.mini(), ["train_epochs=-1"])


def test_the_harness_reads_and_sets_the_shared_fields_by_type():
  from mlbench import fields
  from workloads.llama31_8b import config as llama

  cfg = llama.mini()
  assert fields.PRECISION.get(cfg) is fields.DType.FLOAT32
  assert fields.PRECISION.set(cfg, fields.DType.BFLOAT16).model.dtype is fields.DType.BFLOAT16
  assert fields.REMAT.get(cfg) is fields.Remat.NONE and fields.SCAN_LAYERS.get(cfg) is False
  from workloads.resnet50 import config as resnet

  assert fields.REMAT.get(resnet.mini()) is None  # ResNet has no remat
  assert fields.Field("model.width", str).get(resnet.mini()) is None  # another type: absent
