"""Corpus BLEU from statistics that add up across batches and hosts.

BLEU is not an average of sentence scores: it is computed once from the
corpus totals of clipped n-gram matches, n-gram counts and lengths. Each host
therefore turns its decoded sentences into those totals (`statistics`), the
harness sums them over batches and hosts, and `score` computes BLEU once, so
the result equals a single-host computation exactly. Tokenisation is
sacreBLEU's 13a, lower-cased (uncased BLEU, as the MLPerf reference reports);
the final formula is sacreBLEU's own `BLEU.compute_bleu`.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Sequence

import numpy as np

MAX_ORDER = 4


@functools.cache
def _tokenizer():
  from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

  return Tokenizer13a()


def _ngrams(words: Sequence[str], n: int) -> collections.Counter:
  return collections.Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))


def statistics(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, np.ndarray]:
  """Summable BLEU statistics of sentence pairs: `correct` and `total` n-gram
  counts per order [4], and the hypothesis and reference lengths."""
  correct = np.zeros(MAX_ORDER, np.int64)
  total = np.zeros(MAX_ORDER, np.int64)
  sys_len = ref_len = 0
  tok = _tokenizer()
  for hyp, ref in zip(hypotheses, references, strict=True):
    h, r = tok(hyp.lower()).split(), tok(ref.lower()).split()
    sys_len, ref_len = sys_len + len(h), ref_len + len(r)
    for n in range(1, MAX_ORDER + 1):
      hyp_n, ref_n = _ngrams(h, n), _ngrams(r, n)
      correct[n - 1] += sum(min(c, ref_n[g]) for g, c in hyp_n.items())
      total[n - 1] += max(len(h) - n + 1, 0)
  return {"bleu_correct": correct, "bleu_total": total,
          "bleu_sys_len": np.asarray(sys_len, np.int64),
          "bleu_ref_len": np.asarray(ref_len, np.int64)}


def score(stats: dict[str, np.ndarray]) -> float:
  """Corpus BLEU (0-100) of summed `statistics`."""
  from sacrebleu.metrics.bleu import BLEU

  return float(BLEU.compute_bleu(
      correct=[int(c) for c in stats["bleu_correct"]], total=[int(t) for t in stats["bleu_total"]],
      sys_len=int(stats["bleu_sys_len"]), ref_len=int(stats["bleu_ref_len"]),
      smooth_method="exp").score)
