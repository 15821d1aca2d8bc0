"""Packed BERT: a step's sequences in fewer rows, without padding and without
cross-contamination (Krell et al., "Efficient Sequence Packing without Cross-contamination",
arXiv 2107.02027).

A training step holds exactly `global_batch_size` sequences (MLPerf's batch, so LAMB's
schedule in steps and samples stays the reference's) in a fixed number of rows
(`Schedule.rows`: static shapes, one compiled program). The packer runs online, on each
host, over the stream the input pipeline has already shuffled with the run's seed, so the
order of sequences differs from seed to seed as the reference's does. Each step it takes
the oldest `examples` sequences of its queue and packs them best-fit-decreasing into rows
of `max_seq_length` tokens, at most `max_per_row` sequences and `predictions` masked tokens
a row. Where they need more rows than the step has, the longest of them wait for the next
step and the shortest sequences of the look-ahead (the next `lookahead` of the stream) take
their places. The stream's i-th sequence belongs to step i // examples; one that trails that
place by `max_deferrals` steps must go in, so none trails it by more (`select`). No sequence
is split, dropped or repeated.

A packed row carries, besides the record's features laid end to end: `sequence_ids` (1, 2,
... per sequence, 0 on padding: attention stays within a sequence), `position_ids`
(restarting at 0 for each sequence), masked-LM positions within the row, and per slot (up
to `max_per_row`) the row position of the sequence's [CLS], its next-sentence label and a
weight (0 for an empty slot).

Shape suffixes: R rows, L row length, P masked positions per row, N slots per row.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from mlbench.errors import UserError

MAX_DEFERRALS = 4
"""Steps a sequence may trail its place in the shuffled order (the stream's i-th sequence:
step i // examples) before it must go in: none trails it by more (about a thousandth of an
MLPerf run). Counted from that place, not from when it reached the queue's head: counted from
the head, sequences held behind deferred ones trailed by 5 and 6 steps (1.9% of them, 64
sequences a host on Wikipedia's lengths; benchmarks/README.md)."""

ROW_KEYS = ("input_ids", "input_mask", "segment_ids", "position_ids", "sequence_ids")
SLOT_KEYS = ("cls_positions", "next_sentence_labels", "next_sentence_weights")
MLM_KEYS = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")


@dataclasses.dataclass(frozen=True)
class RowShape:
  """What one packed row can hold."""

  length: int       # L tokens (max_seq_length)
  max_per_row: int  # N sequences
  predictions: int  # P masked tokens

  def shapes(self) -> dict[str, tuple[int, ...]]:
    """The packed batch's features and their shapes per row."""
    out = {k: (self.length,) for k in ROW_KEYS}
    out.update({k: (self.predictions,) for k in MLM_KEYS})
    out.update({k: (self.max_per_row,) for k in SLOT_KEYS})
    return out


def row_predictions(max_predictions_per_seq: int, max_per_row: int, length: int) -> int:
  """Masked positions a row has room for. The reference masks round(15% x length) tokens
  of a sequence, at most `max_predictions_per_seq`; sequences sharing a row have at most
  `length` tokens together, so rounding adds at most one per sequence beyond the first:
  `max_predictions_per_seq + max_per_row - 1` (capped at the row length). The packer checks
  it anyway: a row is never given more masked tokens than this."""
  return min(length, max_predictions_per_seq + max_per_row - 1)


def best_fit_decreasing(lengths: np.ndarray, predictions: np.ndarray,
                        shape: RowShape) -> tuple[np.ndarray, np.ndarray, int]:
  """(row, slot of each sequence, rows used): longest first, each into the row with the
  least room that still takes it (tokens, sequences and masked tokens), else a new row."""
  n = len(lengths)
  room = np.full(n, shape.length)
  count = np.zeros(n, np.int64)
  masked = np.zeros(n, np.int64)
  row = np.zeros(n, np.int64)
  slot = np.zeros(n, np.int64)
  used = 0
  for i in np.argsort(-lengths, kind="stable"):
    fits = ((room[:used] >= lengths[i]) & (count[:used] < shape.max_per_row)
            & (masked[:used] + predictions[i] <= shape.predictions))
    r = int(np.argmin(np.where(fits, room[:used], shape.length + 1))) if fits.any() else used
    used = max(used, r + 1)
    row[i], slot[i] = r, count[r]
    room[r] -= lengths[i]
    count[r] += 1
    masked[r] += predictions[i]
  return row, slot, used


def select(lengths: np.ndarray, predictions: np.ndarray, late: np.ndarray, *,
           examples: int, rows: int, shape: RowShape,
           max_deferrals: int = MAX_DEFERRALS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(chosen queue indices, their rows, their slots) of one step: `examples` sequences of the
  queue (oldest first) in at most `rows` rows. Where the oldest need more rows, their
  longest that may still wait (`late`, the steps each trails its place, below
  `max_deferrals`) are exchanged for the shortest of the rest of the queue.

  Those that may not wait are among the oldest `examples`: after step t every sequence of
  the stream's steps up to t - max_deferrals has gone in (by induction: at step t those of
  step t - max_deferrals, at most `examples`, are the oldest left and go in). So none
  trails its place by more than `max_deferrals` steps.

  Raises:
    UserError: no exchange makes them fit (the data's sequences are longer than the
      packing factor allows).
  """
  chosen = np.arange(examples)
  spare = np.arange(examples, len(lengths))
  while True:
    row, slot, used = best_fit_decreasing(lengths[chosen], predictions[chosen], shape)
    if used <= rows:
      return chosen, row, slot
    may_wait = chosen[late[chosen] < max_deferrals]
    longest = may_wait[np.argsort(-lengths[may_wait], kind="stable")]
    shortest = spare[np.argsort(lengths[spare], kind="stable")]
    k = min(used - rows, len(longest), len(shortest))
    better = lengths[shortest[:k]] < lengths[longest[:k]]
    if k == 0 or not better.any():
      raise UserError(
          f"cannot pack {examples} sequences into {rows} rows of {shape.length} tokens: the "
          "training sequences are longer than data.packing_factor allows; set a smaller "
          "data.packing_factor (or data.max_sequences_per_row=1 to train unpacked)")
    out, into = longest[:k][better], shortest[:k][better]
    chosen = np.concatenate([chosen[~np.isin(chosen, out)], into])
    spare = np.concatenate([spare[~np.isin(spare, into)], out])


def build(examples: list[Mapping[str, np.ndarray]], row: np.ndarray, slot: np.ndarray,
          rows: int, shape: RowShape) -> dict[str, np.ndarray]:
  """The packed batch of `examples` (decoded records) at their rows and slots: each
  sequence's tokens laid after those of the lower slots of its row."""
  shapes = shape.shapes()
  out = {k: np.zeros((rows, *s), np.float32 if k.endswith("weights") else np.int32)
         for k, s in shapes.items()}
  tokens = np.zeros(rows, np.int64)
  masked = np.zeros(rows, np.int64)
  for i in np.lexsort((slot, row)):
    ex, r, s = examples[i], int(row[i]), int(slot[i])
    n, o = int(ex["input_mask"].sum()), int(tokens[r])
    k, m = int((ex["masked_lm_weights"] > 0).sum()), int(masked[r])
    span = slice(o, o + n)
    out["input_ids"][r, span] = ex["input_ids"][:n]
    out["input_mask"][r, span] = 1
    out["segment_ids"][r, span] = ex["segment_ids"][:n]
    out["position_ids"][r, span] = np.arange(n)
    out["sequence_ids"][r, span] = s + 1
    out["masked_lm_positions"][r, m:m + k] = ex["masked_lm_positions"][:k] + o
    out["masked_lm_ids"][r, m:m + k] = ex["masked_lm_ids"][:k]
    out["masked_lm_weights"][r, m:m + k] = 1.0
    out["cls_positions"][r, s] = o
    out["next_sentence_labels"][r, s] = ex["next_sentence_labels"]
    out["next_sentence_weights"][r, s] = 1.0
    tokens[r] += n
    masked[r] += k
  return out


def _split(chunk: Mapping[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
  """The examples of a chunk of decoded records, one dict each."""
  for i in range(len(next(iter(chunk.values())))):
    yield {k: v[i] for k, v in chunk.items()}


@dataclasses.dataclass
class Packer:
  """Packs a stream of decoded sequences into training batches (see the module doc).

  Attributes:
    shape: what a row holds.
    examples: sequences per batch (this host's share of the global batch).
    rows: rows per batch (this host's share).
    lookahead: sequences beyond the step's own that may take a deferred one's place.
    max_deferrals: see `MAX_DEFERRALS`.
    waits: how many sequences went in how many steps after their place (0: at it or before).
  """

  shape: RowShape
  examples: int
  rows: int
  lookahead: int
  max_deferrals: int = MAX_DEFERRALS
  waits: collections.Counter = dataclasses.field(default_factory=collections.Counter)

  def __call__(self, chunks: Iterator[Mapping[str, np.ndarray]]) -> Iterator[dict[str, Any]]:
    """Endless batches from `chunks` (the decoded records in the shuffled order)."""
    for examples, row, slot in self.steps(chunks):
      yield build(examples, row, slot, self.rows, self.shape)

  def steps(self, chunks: Iterator[Mapping[str, np.ndarray]]
            ) -> Iterator[tuple[list[dict[str, np.ndarray]], np.ndarray, np.ndarray]]:
    """Each step's records (of `chunks`, which need only `input_mask` and
    `masked_lm_weights` for the choice) with their rows and slots."""
    stream = (ex for chunk in chunks for ex in _split(chunk))
    queue: list[dict[str, np.ndarray]] = []
    stats = np.zeros((0, 3), np.int64)  # per queued sequence: length, masked tokens, index
    read = 0  # sequences taken from the stream
    for step in itertools.count():
      fresh = [ex for _, ex in zip(range(self.examples + self.lookahead - len(queue)), stream)]
      queue += fresh
      stats = np.concatenate([stats, np.array(
          [[int(ex["input_mask"].sum()), int((ex["masked_lm_weights"] > 0).sum()), read + i]
           for i, ex in enumerate(fresh)], np.int64).reshape(-1, 3)])
      read += len(fresh)
      if len(queue) < self.examples:
        return  # the stream ended (files with fewer records than a step)
      late = step - stats[:, 2] // self.examples
      chosen, row, slot = select(stats[:, 0], stats[:, 1], late, examples=self.examples,
                                 rows=self.rows, shape=self.shape,
                                 max_deferrals=self.max_deferrals)
      self.waits.update(np.maximum(late[chosen], 0).tolist())
      yield [queue[i] for i in chosen], row, slot
      keep = np.flatnonzero(~np.isin(np.arange(len(queue)), chosen))
      stats = stats[keep]
      queue = [queue[i] for i in keep]
