"""GPT samples over Megatron indexed datasets (`mlbench.datasets.indexed`), built exactly as
Megatron-Core's GPTDataset builds them.

The documents, repeated for as many epochs as the requested samples need and shuffled
with numpy's RandomState(seed) (`document_index`), form one token stream; sample i is
stream tokens [i * L, (i + 1) * L], L + 1 of them (inputs and next-token targets), so
consecutive samples share one token. `sample_index[i]` is (position in document_index,
offset) of stream token i * L, which is where Megatron's C++ `build_sample_idx` puts it.
The order samples are read in is a second RandomState shuffle (`shuffle_index`). An
evaluation set is read in order (NeMo's validation set, llama31_8b) or, as Megatron's
GPTDataset builds its validation split, shuffled like a training set of the samples
requested and read from the start (`validation_samples`, gpt_oss_20b).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from mlbench.datasets.indexed import IndexedDataset


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


def validation_samples(dataset: IndexedDataset, seq_length: int, num_samples: int,
                       seed: int) -> GptSamples:
  """The first `num_samples` of Megatron's validation GPTDataset built for `num_samples`
  with `seed`: shuffled as training samples are (NVIDIA/Megatron-LM@8477817
  megatron/core/datasets/gpt_dataset.py L410-456 build every split alike, seeded with the
  run's --seed), read from the start by a sampler capped at `num_samples`
  (mlcommons/training small_llm_moe_pretraining/primus/patches/
  megatron_validation_consumed_samples.patch)."""
  samples = training_samples(dataset, seq_length, num_samples, seed)
  return dataclasses.replace(samples, shuffle=samples.shuffle[:num_samples])


def evaluation_samples(dataset: IndexedDataset, seq_length: int, num_samples: int) -> GptSamples:
  """The first `num_samples` samples of the documents in order (no shuffling)."""
  sizes = np.asarray(dataset.sequence_lengths)
  doc_index = document_index(np.arange(len(sizes), dtype=np.int32), 1, None, False)
  return GptSamples(dataset, doc_index, sample_index(sizes, doc_index, seq_length, num_samples),
                    None)
