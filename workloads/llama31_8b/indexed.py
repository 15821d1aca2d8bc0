"""Megatron indexed datasets (`.bin` + `.idx`), read with numpy memmaps, and GPT samples
built over them exactly as Megatron-Core's GPTDataset builds them.

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

Samples (GPTDataset): the documents, repeated for as many epochs as the requested
samples need and shuffled with numpy's RandomState(seed) (`document_index`), form one
token stream; sample i is stream tokens [i * L, (i + 1) * L], L + 1 of them (inputs and
next-token targets), so consecutive samples share one token. `sample_index[i]` is
(position in document_index, offset) of stream token i * L, which is where
Megatron's C++ `build_sample_idx` puts it. The order samples are read in is a
second RandomState shuffle (`shuffle_index`); an evaluation set is read in order.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterable
from pathlib import Path

import numpy as np

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


def num_epochs(tokens_per_epoch: int, num_samples: int, seq_length: int) -> int:
  """Epochs of the documents needed for `num_samples` samples (GPTDataset._get_num_epochs)."""
  needed = num_samples * seq_length + 1
  return max(1, -(-needed // tokens_per_epoch))


def document_index(documents: np.ndarray, epochs: int, rng: np.random.RandomState | None,
                   separate_final_epoch: bool) -> np.ndarray:
  """The documents repeated `epochs` times, shuffled (all together, or the last epoch on
  its own), int32, as GPTDataset's _build_document_index; rng None: not shuffled."""
  if separate_final_epoch and epochs > 1:
    return np.concatenate([document_index(documents, epochs - 1, rng, False),
                           document_index(documents, 1, rng, False)])
  index = np.tile(np.asarray(documents, np.int32), epochs)
  if rng is not None:
    rng.shuffle(index)
  return index


def sample_index(sizes: np.ndarray, doc_index: np.ndarray, seq_length: int,
                 num_samples: int) -> np.ndarray:
  """[num_samples + 1, 2] (position in doc_index, offset) of stream token i * seq_length:
  the document holding that token (empty documents skipped), as `build_sample_idx`."""
  ends = np.cumsum(sizes[doc_index].astype(np.int64))
  positions = np.arange(num_samples + 1, dtype=np.int64) * seq_length
  where = np.searchsorted(ends, positions, side="right")
  if where[-1] >= len(doc_index):
    raise ValueError(f"{num_samples} samples of {seq_length} + 1 tokens need more than the "
                     f"{int(ends[-1])} tokens of the documents")
  starts = ends[where] - sizes[doc_index[where]]
  return np.stack([where, positions - starts], axis=1)


@dataclasses.dataclass
class GptSamples:
  """Random-access samples of seq_length + 1 token ids (int32) of one indexed dataset."""

  dataset: IndexedDataset
  doc_index: np.ndarray
  sample_idx: np.ndarray
  shuffle: np.ndarray | None

  def __len__(self) -> int:
    return len(self.sample_idx) - 1 if self.shuffle is None else len(self.shuffle)

  def __getitem__(self, i: int) -> np.ndarray:
    j = int(i if self.shuffle is None else self.shuffle[i])
    d0, o0 = (int(v) for v in self.sample_idx[j])
    d1, o1 = (int(v) for v in self.sample_idx[j + 1])
    parts = []
    for d in range(d0, d1 + 1):  # from (d0, o0) through (d1, o1), both ends included
      start = o0 if d == d0 else 0
      stop = o1 + 1 if d == d1 else None
      parts.append(self.dataset.get(int(self.doc_index[d]), offset=start,
                                    length=None if stop is None else stop - start))
    return np.concatenate(parts).astype(np.int32)


def training_samples(dataset: IndexedDataset, seq_length: int, num_samples: int,
                     seed: int) -> GptSamples:
  """GPTDataset's samples for `num_samples` requested, shuffled with `seed`."""
  sizes = np.asarray(dataset.sequence_lengths)
  documents = np.arange(len(sizes), dtype=np.int32)
  per_epoch = int(sizes.sum())
  epochs = num_epochs(per_epoch, num_samples, seq_length)
  separate, sans_final = False, 0
  if epochs > 1:  # a small final epoch is shuffled on its own (GPTDataset's 80 % rule)
    sans_final = ((epochs - 1) * per_epoch - 1) // seq_length
    per_epoch_samples = (per_epoch - 1) // seq_length
    separate = num_samples - sans_final < int(0.80 * per_epoch_samples)
  rng = np.random.RandomState(seed)
  doc_index = document_index(documents, epochs, rng, separate)
  total = (epochs * per_epoch - 1) // seq_length
  idx = sample_index(sizes, doc_index, seq_length, total)
  first = sans_final if separate else total
  shuffle = np.arange(first, dtype=np.int64)
  rng.shuffle(shuffle)
  if first < total:
    rest = np.arange(first, total, dtype=np.int64)
    rng.shuffle(rest)
    shuffle = np.concatenate([shuffle, rest])
  return GptSamples(dataset, doc_index, idx, shuffle)


def evaluation_samples(dataset: IndexedDataset, seq_length: int, num_samples: int) -> GptSamples:
  """The first `num_samples` samples of the documents in order (no shuffling)."""
  sizes = np.asarray(dataset.sequence_lengths)
  doc_index = document_index(np.arange(len(sizes), dtype=np.int32), 1, None, False)
  return GptSamples(dataset, doc_index, sample_index(sizes, doc_index, seq_length, num_samples),
                    None)
