"""TFRecord files: the one writer of tf.train.Examples, for the full datasets `mlbench data
prepare` writes (imagenet, coco) and the mini datasets the workloads generate (a plugin
helper, like `mlbench.train.data`), their readers for `verify`, and the JPEG clean-up of
the image datasets.

The references convert images with TensorFlow and fix two kinds of bad file in
ImageNet by re-encoding: a PNG saved with a .JPEG name, and JPEGs in CMYK. Here the
bytes say which is which (PNG signature; a JPEG frame header with four components),
and both are decoded to RGB and re-encoded as JPEG at quality 100, as the
reference's `ImageCoder` does. Everything else is stored byte for byte.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Start-of-frame markers (SOF0-SOF15 without DHT C4, JPG C8 and DAC CC).
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def tf() -> Any:
  """TensorFlow on the CPU only, quiet: these workers never need an accelerator."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow

  tensorflow.config.set_visible_devices([], "GPU")
  return tensorflow


def jpeg_components(data: bytes) -> int | None:
  """The number of colour components in a JPEG's frame header; None if not a JPEG."""
  if data[:2] != b"\xff\xd8":
    return None
  i = 2
  while i + 4 <= len(data):
    if data[i] != 0xFF:
      return None
    marker = data[i + 1]
    if marker == 0xFF:  # fill byte
      i += 1
      continue
    length = int.from_bytes(data[i + 2:i + 4], "big")
    if marker in _SOF:
      return data[i + 9] if i + 9 < len(data) else None
    i += 2 + length
  return None


def clean_jpeg(data: bytes) -> tuple[bytes, int, int, str | None]:
  """(JPEG bytes, height, width, what was fixed or None) of an image file's bytes.

  Raises ValueError for bytes that are no image TensorFlow can decode.
  """
  t = tf()
  fixed = None
  try:
    if data.startswith(PNG_SIGNATURE):
      data, fixed = _reencode(t.io.decode_png(data, channels=3)), "png"
    elif jpeg_components(data) == 4:
      data, fixed = _reencode(t.io.decode_jpeg(data, channels=3)), "cmyk"
    shape = t.io.decode_jpeg(data, channels=3).shape
  except (t.errors.InvalidArgumentError, t.errors.UnknownError) as e:
    # TF prefixes the op's internal name and suffixes the op: keep the reason only.
    reason = re.sub(r"\{\{.*?\}\}\s*|\s*\[Op:\w+\]", "", str(e).splitlines()[0])
    raise ValueError(reason[:200]) from None
  return data, int(shape[0]), int(shape[1]), fixed


def _reencode(image: Any) -> bytes:
  return tf().io.encode_jpeg(image, format="rgb", quality=100).numpy()


def feature(value: Any) -> Any:
  """A tf.train.Feature of bytes / str, int, float, a list of one kind (empty: floats), or a
  numpy array (its dtype gives the kind, so an empty one keeps it)."""
  t = tf()
  if isinstance(value, np.ndarray):
    kind = value.dtype.kind
    values = value.reshape(-1).tolist()
    first = b"" if kind in "SOU" else 0.0 if kind == "f" else 0
  else:
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    first = values[0] if values else 0.0
  if isinstance(first, (bytes, str)):
    return t.train.Feature(bytes_list=t.train.BytesList(
        value=[v.encode() if isinstance(v, str) else v for v in values]))
  if isinstance(first, float):
    return t.train.Feature(float_list=t.train.FloatList(value=values))
  return t.train.Feature(int64_list=t.train.Int64List(value=[int(v) for v in values]))


def serialize(features: dict[str, Any]) -> bytes:
  """A tf.train.Example's bytes, with its feature map in a fixed order: protobuf orders
  maps arbitrarily otherwise, and a resumed job must write the same bytes."""
  t = tf()
  return t.train.Example(features=t.train.Features(
      feature={k: feature(v) for k, v in features.items()})).SerializeToString(deterministic=True)


def write(path: Path | str, records: Iterable[bytes]) -> None:
  """Writes serialized records into one TFRecord file."""
  with tf().io.TFRecordWriter(str(path)) as writer:
    for record in records:
      writer.write(record)


def write_shards(path_pattern: str, examples: Iterable[dict[str, Any]],
                 num_shards: int) -> list[str]:
  """Writes examples (feature dicts, see `feature`) round-robin into `num_shards` files.

  Args:
    path_pattern: file name with `{index}` and `{count}` fields, e.g.
      `train-{index:05d}-of-{count:05d}`.
    examples: dicts of feature name -> value.
    num_shards: number of files.

  Returns:
    The written paths.
  """
  t = tf()
  paths = [path_pattern.format(index=i, count=num_shards) for i in range(num_shards)]
  writers = [t.io.TFRecordWriter(p) for p in paths]
  try:
    for i, example in enumerate(examples):
      writers[i % num_shards].write(serialize(example))
  finally:
    for w in writers:
      w.close()
  return paths


def examples(path: Path | str) -> list[Any]:
  """Every record of a local TFRecord file as a tf.train.Example."""
  t = tf()
  return [t.train.Example.FromString(r.numpy()) for r in t.data.TFRecordDataset(str(path))]


def count(path: Path | str) -> int:
  """Records in one TFRecord file (reads it all, through tf.data's file system)."""
  return sum(1 for _ in tf().data.TFRecordDataset(str(path)))


def first(path: Any) -> bytes | None:
  """The first record of a TFRecord file (None if it has none).

  A local file is read by tf.data, which checks the record's CRCs. A file in a
  bucket is read through the path layer (`etils.epath`), with the client mlbench
  writes buckets with, which checks the framing only (a little-endian uint64
  length, its 4-byte CRC, the data, its CRC); the manifest's sizes, and with
  `--full` its sha256 and tf.data's count of every record, check the rest.
  """
  from mlbench.storage import paths

  if not paths.is_remote(path):
    got = next(iter(tf().data.TFRecordDataset(str(path)).take(1)), None)
    return None if got is None else got.numpy()
  with paths.path(path).open("rb") as f:
    head = f.read(12)
    if not head:
      return None
    if len(head) < 12:
      raise ValueError(f"{path}: truncated record header")
    length = int.from_bytes(head[:8], "little")
    data = f.read(length)
    if len(data) < length or len(f.read(4)) < 4:
      raise ValueError(f"{path}: truncated record of {length} bytes")
  return data
