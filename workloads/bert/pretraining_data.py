"""Pretraining examples from text, by the procedure of BERT's create_pretraining_data.py.

Documents are lists of sentences (lines); each example packs whole sentences of
one document into segment A and either the actual continuation (label 0) or
sentences of another document (label 1, "random next") into segment B, then
masks 15% of the tokens: 80% become [MASK], 10% a random token, 10% stay. The
features are those of the MLPerf BERT TFRecords. Written from the paper and the
reference's description; pure Python and NumPy, deterministic for a given seed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np

SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


@dataclasses.dataclass(frozen=True)
class Masking:
  max_seq_length: int
  max_predictions_per_seq: int
  masked_lm_prob: float = 0.15
  short_seq_prob: float = 0.1


Document = Sequence[Sequence[int]]
"""A document: sentences of token ids (no special tokens)."""


def _pick_b(docs: Sequence[Document], doc_index: int, chunk: list, a_end: int, target_b: int,
            rng: np.random.Generator) -> tuple[list[int], bool, int]:
  """(tokens_b, is_random_next, sentences to give back to the current document)."""
  if len(chunk) == 1 or rng.random() < 0.5:
    other = doc_index
    while other == doc_index and len(docs) > 1:
      other = int(rng.integers(len(docs)))
    doc = docs[other]
    start = int(rng.integers(len(doc)))
    tokens_b: list[int] = []
    for sentence in doc[start:]:
      tokens_b.extend(sentence)
      if len(tokens_b) >= target_b:
        break
    return tokens_b, True, len(chunk) - a_end
  return [t for s in chunk[a_end:] for t in s], False, 0


def _truncate_pair(a: list[int], b: list[int], max_tokens: int, rng: np.random.Generator) -> None:
  """Drops tokens from the front or back (at random) of the longer segment."""
  while len(a) + len(b) > max_tokens:
    longer = a if len(a) > len(b) else b
    del longer[0 if rng.random() < 0.5 else -1]


def segment_pairs(docs: Sequence[Document], doc_index: int, max_seq_length: int,
                  short_seq_prob: float, rng: np.random.Generator
                  ) -> Iterator[tuple[list[int], list[int], bool]]:
  """(tokens_a, tokens_b, is_random_next) for one document."""
  max_tokens = max_seq_length - 3  # [CLS] A [SEP] B [SEP]
  target = max_tokens if rng.random() >= short_seq_prob else int(rng.integers(2, max_tokens + 1))
  doc = docs[doc_index]
  chunk: list[Sequence[int]] = []
  length = i = 0
  while i < len(doc):
    chunk.append(doc[i])
    length += len(doc[i])
    if i == len(doc) - 1 or length >= target:
      if chunk:
        a_end = int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1
        tokens_a = [t for s in chunk[:a_end] for t in s]
        tokens_b, random_next, give_back = _pick_b(docs, doc_index, chunk, a_end,
                                                   target - len(tokens_a), rng)
        i -= give_back
        _truncate_pair(tokens_a, tokens_b, max_tokens, rng)
        if tokens_a and tokens_b:
          yield tokens_a, tokens_b, random_next
      chunk, length = [], 0
      target = (max_tokens if rng.random() >= short_seq_prob
                else int(rng.integers(2, max_tokens + 1)))
    i += 1


def mask_tokens(tokens: list[int], special: dict[str, int], vocab_size: int, masking: Masking,
                rng: np.random.Generator) -> tuple[list[int], list[int], list[int]]:
  """(masked tokens, positions, original ids) with BERT's 80/10/10 rule."""
  candidates = [i for i, t in enumerate(tokens) if t not in (special["[CLS]"], special["[SEP]"])]
  rng.shuffle(candidates)
  count = min(masking.max_predictions_per_seq,
              max(1, int(round(len(tokens) * masking.masked_lm_prob))))
  chosen = sorted(candidates[:count])
  out = list(tokens)
  for i in chosen:
    roll = rng.random()
    if roll < 0.8:
      out[i] = special["[MASK]"]
    elif roll < 0.9:
      out[i] = int(rng.integers(len(SPECIAL), vocab_size))
  return out, chosen, [tokens[i] for i in chosen]


def features(tokens_a: list[int], tokens_b: list[int], random_next: bool, special: dict[str, int],
             vocab_size: int, masking: Masking, rng: np.random.Generator) -> dict[str, np.ndarray]:
  """One example in the MLPerf BERT TFRecord schema, padded to fixed lengths."""
  tokens = [special["[CLS]"], *tokens_a, special["[SEP]"], *tokens_b, special["[SEP]"]]
  segments = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
  ids, positions, labels = mask_tokens(tokens, special, vocab_size, masking, rng)
  seq_pad = masking.max_seq_length - len(ids)
  pred_pad = masking.max_predictions_per_seq - len(positions)
  return {
      "input_ids": np.array(ids + [0] * seq_pad, np.int64),
      "input_mask": np.array([1] * len(ids) + [0] * seq_pad, np.int64),
      "segment_ids": np.array(segments + [0] * seq_pad, np.int64),
      "masked_lm_positions": np.array(positions + [0] * pred_pad, np.int64),
      "masked_lm_ids": np.array(labels + [0] * pred_pad, np.int64),
      "masked_lm_weights": np.array([1.0] * len(positions) + [0.0] * pred_pad, np.float32),
      "next_sentence_labels": np.array([int(random_next)], np.int64),
  }


def examples(docs: Sequence[Document], special: dict[str, int], vocab_size: int,
             masking: Masking, dupe_factor: int, seed: int) -> list[dict[str, np.ndarray]]:
  """All examples of `dupe_factor` passes over `docs` (new segments and masks each), shuffled."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(dupe_factor):
    for d in range(len(docs)):
      for a, b, random_next in segment_pairs(docs, d, masking.max_seq_length,
                                             masking.short_seq_prob, rng):
        out.append(features(a, b, random_next, special, vocab_size, masking, rng))
  order = rng.permutation(len(out))
  return [out[i] for i in order]
