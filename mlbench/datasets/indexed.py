"""Megatron indexed datasets (`.bin` + `.idx`): the format `mlbench data prepare c4` writes
and the language models read (llama31_8b's and gpt_oss_20b's samples,
`workloads/common/gpt_samples.py`),
read with numpy memmaps; a plugin helper, like `records` for TFRecords.

The format (megatron/core/datasets/indexed_dataset.py, "MMIDIDX"): the `.bin` file is
every sequence's tokens back to back in one dtype; the `.idx` file is

    b"MMIDIDX\\x00\\x00"   9-byte magic
    <Q  version (1)
    <B  dtype code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32,
        8 uint16)
    <Q  sequence count S
    <Q  document count + 1 (D + 1)
    int32[S]      tokens per sequence
    int64[S]      byte offset of each sequence in `.bin`
    int64[D + 1]  sequence index where each document starts, then S

Tokenised text (NeMo's preprocess_data_for_megatron.py, as the reference runs it)
has one sequence per document.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from mlbench.storage import paths

MAGIC = b"MMIDIDX\x00\x00"
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
          7: np.float32, 8: np.uint16}
CODES = {np.dtype(v): k for k, v in DTYPES.items()}
_HEADER = struct.Struct("<9sQBQQ")


class FormatError(ValueError):
  """A file that is not a Megatron indexed dataset."""


class IndexedDataset:
  """A read-only Megatron indexed dataset; nothing is read until a sequence is asked for."""

  def __init__(self, prefix: str | Path):
    self.prefix = str(prefix)
    idx = Path(self.prefix + ".idx")
    with idx.open("rb") as f:
      head = f.read(_HEADER.size)
    if len(head) < _HEADER.size:
      raise FormatError(f"{idx} is too short to be a Megatron index")
    magic, version, code, sequences, documents = _HEADER.unpack(head)
    if magic != MAGIC or version != 1 or code not in DTYPES:
      raise FormatError(f"{idx} is not a Megatron MMIDIDX index (magic {magic!r}, version "
                        f"{version}, dtype code {code})")
    self.dtype = np.dtype(DTYPES[code])
    offset = _HEADER.size
    self.sequence_lengths = np.memmap(idx, np.int32, "r", offset, (sequences,))
    offset += 4 * sequences
    self.sequence_pointers = np.memmap(idx, np.int64, "r", offset, (sequences,))
    offset += 8 * sequences
    self.document_indices = np.memmap(idx, np.int64, "r", offset, (documents,))
    self.tokens = np.memmap(self.prefix + ".bin", self.dtype, "r")

  def __len__(self) -> int:
    return len(self.sequence_lengths)

  def get(self, index: int, offset: int = 0, length: int | None = None) -> np.ndarray:
    """Tokens [offset, offset + length) of sequence `index` (to its end if length is None)."""
    start = int(self.sequence_pointers[index]) // self.dtype.itemsize + offset
    stop = (start - offset + int(self.sequence_lengths[index]) if length is None
            else start + length)
    return np.asarray(self.tokens[start:stop])


def write(prefix: str | Path, documents: Iterable[np.ndarray], dtype: type = np.uint16) -> int:
  """Writes `documents` (token arrays, one sequence each) as `prefix.bin` and `prefix.idx`.

  Returns the number of documents.
  """
  dtype = np.dtype(dtype)
  lengths = []
  with open(str(prefix) + ".bin", "wb") as bin_file:
    for doc in documents:
      doc = np.asarray(doc)
      if doc.size and (doc.min() < np.iinfo(dtype).min or doc.max() > np.iinfo(dtype).max):
        raise ValueError(f"token ids {doc.min()}..{doc.max()} do not fit {dtype}")
      bin_file.write(doc.astype(dtype).tobytes())
      lengths.append(doc.size)
  sizes = np.asarray(lengths, np.int32)
  pointers = np.concatenate([[0], np.cumsum(sizes.astype(np.int64))[:-1]]) * dtype.itemsize
  with open(str(prefix) + ".idx", "wb") as idx_file:
    idx_file.write(_HEADER.pack(MAGIC, 1, CODES[dtype], len(sizes), len(sizes) + 1))
    idx_file.write(sizes.tobytes())
    idx_file.write(pointers.astype(np.int64).tobytes())
    idx_file.write(np.arange(len(sizes) + 1, dtype=np.int64).tobytes())
  return len(sizes)


def check(prefix: paths.Path, *, required: bool = True) -> tuple[str, bool | None]:
  """(what was found, ok) of the dataset at `prefix` (`mlbench data verify`): its index
  parses and its `.bin` holds exactly the tokens the index lists. Missing files fail a
  `required` dataset only; one in a bucket is not read (ok None)."""
  bin_, idx = (prefix.parent / f"{prefix.name}{ext}" for ext in (".bin", ".idx"))
  if not idx.is_file() or not bin_.is_file():
    return "missing .bin or .idx", False if required else None
  if paths.is_remote(prefix):  # The index is read through a memory map: local files only.
    return "present (in a bucket: sizes checked against the manifest only)", None
  try:
    ds = IndexedDataset(prefix)
  except (FormatError, ValueError) as e:
    return str(e), False
  tokens = int(ds.sequence_lengths.sum())
  size = Path(str(prefix) + ".bin").stat().st_size
  ok = size == tokens * ds.dtype.itemsize
  return (f"{len(ds):,} documents, {tokens:,} {ds.dtype} tokens" if ok else
          f".bin holds {size:,} bytes, the index lists {tokens * ds.dtype.itemsize:,}", ok)
