"""`mlbench data prepare imagenet`: a tiny ILSVRC2012 tree written here (JPEGs by
TensorFlow, a CMYK JPEG by Pillow, a PNG named .JPEG, a broken file), converted to the
reference's TFRecords, verified, and decoded by the resnet50 workload's own pipeline."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from mlbench.cli import main
from mlbench.datasets import records

WNIDS = ("n01440764", "n01443537", "n01484850")


def _jpeg(rng: np.random.Generator, h: int = 40, w: int = 52) -> bytes:
  image = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
  return tf.io.encode_jpeg(image, quality=90).numpy()


def _cmyk_jpeg() -> bytes:
  from PIL import Image

  buffer = io.BytesIO()
  Image.new("CMYK", (36, 30), (10, 200, 30, 0)).save(buffer, "JPEG")
  return buffer.getvalue()


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
  root = tmp_path_factory.mktemp("ilsvrc")
  rng = np.random.default_rng(0)
  for wnid in WNIDS:
    (root / "train" / wnid).mkdir(parents=True)
    for i in range(5):
      (root / "train" / wnid / f"{wnid}_{i}.JPEG").write_bytes(_jpeg(rng))
  (root / "train" / WNIDS[0] / f"{WNIDS[0]}_cmyk.JPEG").write_bytes(_cmyk_jpeg())
  png = tf.io.encode_png(rng.integers(0, 255, (33, 27, 3), dtype=np.uint8)).numpy()
  (root / "train" / WNIDS[1] / f"{WNIDS[1]}_2933.JPEG").write_bytes(png)
  (root / "train" / WNIDS[2] / f"{WNIDS[2]}_broken.JPEG").write_bytes(b"\xff\xd8 not a jpeg")
  (root / "val").mkdir()
  rows = ["ImageId,PredictionString"]
  for i in range(6):
    name = f"ILSVRC2012_val_{i + 1:08d}"
    (root / "val" / f"{name}.JPEG").write_bytes(_jpeg(rng, 44, 38))
    rows.append(f"{name},{WNIDS[i % 3]} 1 2 30 40")
  (root / "LOC_val_solution.csv").write_text("\n".join(rows) + "\n")
  return root


def _prepare(raw: Path, out: Path, *extra: str) -> int:
  return main(["data", "prepare", "imagenet", "--raw", str(raw), "--out", str(out),
               "--train-shards", "4", "--val-shards", "2", *extra])


def _parse(path: Path) -> list[tf.train.Example]:
  return [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(path))]


@pytest.fixture(scope="module")
def prepared(raw, tmp_path_factory) -> Path:
  out = tmp_path_factory.mktemp("imagenet-out")
  assert _prepare(raw, out, "--workers", "1") == 0
  return out


def test_the_reference_files_labels_and_fixes(raw, prepared, capsys):
  names = sorted(p.name for p in prepared.glob("*-of-*"))
  assert names == [f"train-{i:05d}-of-00004" for i in range(4)] + [
      f"validation-{i:05d}-of-00002" for i in range(2)]
  train = [e for i in range(4) for e in _parse(prepared / f"train-{i:05d}-of-00004")]
  assert len(train) == 17  # 18 files, the broken one left out
  by_name = {e.features.feature["image/filename"].bytes_list.value[0].decode(): e for e in train}
  for name, e in by_name.items():
    f = e.features.feature
    wnid = name.split("_")[0]
    assert f["image/class/synset"].bytes_list.value[0].decode() == wnid
    assert f["image/class/label"].int64_list.value[0] == WNIDS.index(wnid) + 1
    data = f["image/encoded"].bytes_list.value[0]
    assert records.jpeg_components(data) == 3, name  # RGB JPEG, CMYK and PNG included
    image = tf.io.decode_jpeg(data)
    assert (f["image/height"].int64_list.value[0], f["image/width"].int64_list.value[0]) == (
        image.shape[0], image.shape[1])
  assert tf.io.decode_jpeg(by_name[f"{WNIDS[0]}_cmyk.JPEG"].features.feature[
      "image/encoded"].bytes_list.value[0]).shape == (30, 36, 3)
  assert tf.io.decode_jpeg(by_name[f"{WNIDS[1]}_2933.JPEG"].features.feature[
      "image/encoded"].bytes_list.value[0]).shape == (33, 27, 3)
  val = [e for i in range(2) for e in _parse(prepared / f"validation-{i:05d}-of-00002")]
  assert [e.features.feature["image/class/label"].int64_list.value[0] for e in val] == [
      1, 2, 3, 1, 2, 3]


def test_the_shuffle_is_the_references(raw, prepared):
  import random

  files = sorted((p, p.parent.name) for p in (raw / "train").glob("*/*.JPEG"))
  order = list(range(len(files)))
  random.seed(0)
  random.shuffle(order)
  expected = [files[i][0].name for i in order if "broken" not in files[i][0].name]
  got = [e.features.feature["image/filename"].bytes_list.value[0].decode()
         for i in range(4) for e in _parse(prepared / f"train-{i:05d}-of-00004")]
  assert got == expected


def test_the_resnet50_pipeline_decodes_a_batch(prepared):
  from mlbench.train import data
  from mlbench.workload import Split
  from workloads.common import imagenet
  from workloads.resnet50 import config, input_pipeline

  cfg = config.full()
  cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, image_size=32,
                                                          eval_resize=36))
  files = imagenet.files(cfg, prepared, Split.TRAIN)
  ds = data.train_dataset(files, input_pipeline.decode(cfg, Split.TRAIN), per_host_batch=4,
                          seed=0, host=0, hosts=1)
  batch = next(data.numpy_batches(ds))
  assert batch["image"].shape == (4, 32, 32, 3) and set(batch["label"]) <= {0, 1, 2}
  evals = data.eval_dataset(imagenet.files(cfg, prepared, Split.EVAL),
                            input_pipeline.decode(cfg, Split.EVAL), num_examples=6,
                            per_host_batch=6, host=0, hosts=1)
  batch = next(data.numpy_batches(evals))
  assert batch["label"].tolist() == [0, 1, 2, 0, 1, 2] and np.isfinite(batch["image"]).all()


def test_the_broken_file_is_listed_not_fatal(raw, tmp_path, capsys):
  out = tmp_path / "out"
  assert _prepare(raw, out, "--workers", "1") == 0
  err = capsys.readouterr().err
  assert "unreadable, left out:" in err and "n01484850_broken.JPEG" in err
  assert "wrote 6 shard(s), skipped 0 finished; 23 records" in err


def _bytes(out: Path) -> dict[str, bytes]:
  return {p.name: p.read_bytes() for p in out.glob("*-of-*")}


@pytest.mark.slow  # the fork server imports TensorFlow: about 20 s on 2 busy cores
def test_two_workers_write_the_bytes_one_writes(raw, prepared, tmp_path):
  out = tmp_path / "out"
  assert _prepare(raw, out, "--workers", "2") == 0
  assert _bytes(out) == _bytes(prepared)


def test_an_interrupted_prepare_resumes_byte_identically(raw, prepared, tmp_path, capsys):
  out = tmp_path / "out"
  assert _prepare(raw, out, "--workers", "1") == 0
  first = _bytes(out)
  assert first == _bytes(prepared)  # and a second job writes the same bytes
  (out / "train-00002-of-00004").unlink()
  (out / ".mlbench" / "validation-00001-of-00002.json").unlink()
  capsys.readouterr()
  assert _prepare(raw, out, "--workers", "1") == 0
  assert "wrote 2 shard(s), skipped 4 finished" in capsys.readouterr().err
  assert _bytes(out) == first
  # Other shard counts would write other files beside these: refused, with the difference.
  assert main(["data", "prepare", "imagenet", "--raw", str(raw), "--out", str(out),
               "--train-shards", "3", "--val-shards", "2"]) == 2
  err = capsys.readouterr().err
  assert "holds shards prepared with other options (train files: 4 there, 3 now)" in err
  assert err.count("\n") == 1


@pytest.mark.parametrize("layout, message", [
    ({}, "holds neither train/ nor val/; expected RAW/train/<wnid>/*.JPEG"),
    ({"train/n1/a.txt": b"x"}, "no training images in"),
    ({"val/ILSVRC2012_val_00000001.JPEG": b"x"}, "no validation labels for"),
])
def test_a_wrong_layout_is_one_line_with_exit_code_2(tmp_path, capsys, layout, message):
  raw = tmp_path / "raw"
  raw.mkdir()
  for name, body in layout.items():
    (raw / name).parent.mkdir(parents=True, exist_ok=True)
    (raw / name).write_bytes(body)
  assert _prepare(raw, tmp_path / "out") == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and message in err and err.count("\n") == 1


def _verify(out: Path, *extra: str) -> int:
  return main(["data", "verify", "imagenet", str(out), *extra])


def test_verify_passes_a_prepared_set_and_names_what_is_wrong(prepared, tmp_path, capsys):
  import shutil

  assert _verify(prepared, "--full") == 0
  table = capsys.readouterr().out
  for check in ("prepare finished", "train files", "train numbering", "train sizes",
                "train schema", "train records", "train sha256", "validation records"):
    assert check in table
  assert "WRONG" not in table and "17" in table
  broken = tmp_path / "broken"
  shutil.copytree(prepared, broken)
  (broken / "train-00001-of-00004").unlink()
  with open(broken / "validation-00000-of-00002", "ab") as f:
    f.write(b"x")
  assert _verify(broken) == 1
  captured = capsys.readouterr()
  assert "check(s) failed: train files, train numbering, train sizes, validation sizes" in (
      captured.err)
  assert "missing 1" in captured.out
  data = bytearray((broken / "train-00002-of-00004").read_bytes())
  data[20] ^= 0xFF  # inside the first record: its CRC no longer matches
  (broken / "train-00002-of-00004").write_bytes(bytes(data))
  assert _verify(broken, "--full") == 1
  captured = capsys.readouterr()
  assert "train records" in captured.err and "DataLossError" in captured.out
  assert "train-00002-of-00004" in captured.out and "Traceback" not in captured.err


def test_an_emptied_training_set_is_one_line_not_a_hang(tmp_path):
  """Every training file of a host emptied: tf.data's repeat() of nothing ends, and the
  loop says so in one line instead of a StopIteration traceback."""
  from mlbench.errors import UserError
  from mlbench.train import data, loop

  empty = tmp_path / "train-00000-of-00001"
  empty.write_bytes(b"")
  ds = data.train_dataset([str(empty)], lambda r, s: {"n": tf.strings.length(r)},
                          per_host_batch=4, seed=0, host=0, hosts=1)
  with pytest.raises(UserError, match=r"^the training input ran out after step 7: this host's "
                                      r"training files hold no records \(emptied\?\)"):
    loop._next_batch(data.numpy_batches(ds), 7)


def test_verify_without_a_manifest_holds_a_set_to_the_reference(prepared, tmp_path, capsys):
  import shutil

  bare = tmp_path / "bare"
  shutil.copytree(prepared, bare, ignore=shutil.ignore_patterns(".mlbench", "mlbench-data.json"))
  assert _verify(bare) == 1
  out = capsys.readouterr().out
  assert "1,024" in out and "checked against the reference" in out


def test_verify_a_folder_that_is_not_there_is_one_line(tmp_path, capsys):
  assert _verify(tmp_path / "nope") == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and err.count("\n") == 1


def _val_only(tmp_path: Path, n: int = 4) -> Path:
  raw = tmp_path / "raw"
  (raw / "val").mkdir(parents=True)
  for i in range(n):
    (raw / "val" / f"ILSVRC2012_val_{i + 1:08d}.JPEG").write_bytes(b"")
  return raw


def test_validation_labels_from_the_reference_list_and_the_devkit(tmp_path):
  from scipy.io import savemat

  from mlbench.datasets import imagenet

  raw = _val_only(tmp_path)
  wnids = ["n01443537", "n01440764", "n01484850", "n01440764"]
  (raw / "imagenet_2012_validation_synset_labels.txt").write_text("\n".join(wnids) + "\n")
  assert [w for _, w in imagenet.val_images(raw, None)] == wnids
  # The devkit numbers synsets its own way (not sorted by wnid): 1 -> n01484850, ...
  devkit = tmp_path / "ILSVRC2012_devkit_t12"
  (devkit / "data").mkdir(parents=True)
  synsets = np.array([(1, "n01484850"), (2, "n01440764"), (3, "n01443537")],
                     dtype=[("ILSVRC2012_ID", object), ("WNID", object)])
  savemat(devkit / "data" / "meta.mat", {"synsets": synsets})
  (devkit / "data" / "ILSVRC2012_validation_ground_truth.txt").write_text("3\n2\n1\n2\n")
  assert [w for _, w in imagenet.val_images(raw, devkit)] == wnids


def test_labels_for_other_images_are_one_line(tmp_path, capsys):
  raw = _val_only(tmp_path)
  (raw / "imagenet_2012_validation_synset_labels.txt").write_text("n01443537\n")
  assert _prepare(raw, tmp_path / "out") == 2
  err = capsys.readouterr().err
  assert "labels 1 validation images but" in err and err.count("\n") == 1


@pytest.mark.slow  # compiling ResNet-50 on the CPU takes about a minute
def test_one_train_step_of_resnet50_on_the_prepared_records(prepared):
  """The full config's ResNet-50 at 32x32 pixels, through the harness's compiled step."""
  import jax

  from mlbench.train import data, steps
  from mlbench.train import mesh as mesh_lib
  from mlbench.workload import Split, StepContext
  from workloads.common import imagenet
  from workloads.resnet50 import WORKLOAD, config, input_pipeline

  full = config.full()
  cfg = dataclasses.replace(full, global_batch_size=8, data=dataclasses.replace(
      full.data, image_size=32, eval_resize=36))
  sched = WORKLOAD.schedule(cfg)
  mesh = mesh_lib.make_mesh()
  programs = steps.compile_programs(WORKLOAD, cfg, sched, mesh, StepContext(mesh=mesh),
                                    WORKLOAD.optimizer(cfg, sched))
  ds = data.train_dataset(imagenet.files(cfg, prepared, Split.TRAIN),
                          input_pipeline.decode(cfg, Split.TRAIN), per_host_batch=8, seed=0,
                          host=0, hosts=1)
  batch = next(data.numpy_batches(ds))
  state, sums = programs.train(programs.init_state(0), programs.fresh_sums(),
                               mesh_lib.to_global(batch, programs.batch_sharding, 8))
  assert np.isfinite(float(jax.device_get(sums)["loss"]))
  assert int(jax.device_get(state.step)) == 1
