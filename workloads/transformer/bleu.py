"""The MLPerf reference's BLEU, from statistics that add up across batches and hosts.

BLEU is not an average of sentence scores: it is computed once from the
corpus totals of clipped n-gram matches, n-gram counts and lengths. Each host
therefore turns its decoded sentences into those totals (`statistics`), the
harness sums them over batches and hosts, and `score` computes BLEU once, so
the result equals a single-host computation exactly. This is how Google's
MLPerf JAX Transformer scores (training_results_v0.7
Google/benchmarks/transformer/implementations/transformer-research-JAX-tpu-v3-8192/bleu.py:
`bleu_partial` L235-245 per host, summed, then `complete_bleu` L248-282), and
the arithmetic is the reference's (mlcommons/training
retired_benchmarks/transformer/tensorflow/transformer/compute_bleu.py and
utils/metrics.py `compute_bleu` L222-285): uncased (both sides lower-cased),
tokenised by `bleu_tokenize` (mteval-v14's international tokenisation).

`bleu_tokenize` is transcribed rather than taken from sacreBLEU: sacreBLEU's
`intl` tokenizer treats every Unicode number (`\\p{N}`: superscripts,
fractions) as a digit, the reference only decimal digits (`\\d`), so the two
split "x²." differently; and it splits off the backslash, which the reference's
unescaped character class never matches.
"""

from __future__ import annotations

import collections
import functools
import math
import re
import sys
import unicodedata
from collections.abc import Sequence

import numpy as np

MAX_ORDER = 4


@functools.cache
def _category_chars(prefix: str) -> str:
  """Every code point below sys.maxunicode whose category starts with `prefix`
  (the reference's `UnicodeRegex.property_chars`, compute_bleu.py L45-47)."""
  return "".join(chr(x) for x in range(sys.maxunicode)
                 if unicodedata.category(chr(x)).startswith(prefix))


@functools.cache
def _patterns() -> tuple[re.Pattern, re.Pattern, re.Pattern]:
  """The reference's three patterns (compute_bleu.py L40-43), built the same way:
  the characters go into the classes unescaped, so, as there, the backslash
  escapes the ']' after it and is itself never split off."""
  punctuation = _category_chars("P")
  return (re.compile(r"([^\d])([" + punctuation + r"])"),
          re.compile(r"([" + punctuation + r"])([^\d])"),
          re.compile("([" + _category_chars("S") + "])"))


def bleu_tokenize(text: str) -> list[str]:
  """The reference's tokenisation (compute_bleu.py L53-80): punctuation is split
  off unless a digit precedes or follows it, symbols always; then whitespace."""
  nondigit_punct, punct_nondigit, symbol = _patterns()
  text = nondigit_punct.sub(r"\1 \2 ", text)
  text = punct_nondigit.sub(r" \1 \2", text)
  return symbol.sub(r" \1 ", text).split()


def _ngrams(words: Sequence[str], n: int) -> collections.Counter:
  return collections.Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))


def statistics(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, np.ndarray]:
  """Summable BLEU statistics of sentence pairs (the reference's
  `compute_bleu_matches`): clipped n-gram matches and n-gram counts per order
  [4], and the hypothesis and reference lengths in tokens."""
  correct = np.zeros(MAX_ORDER, np.int64)
  total = np.zeros(MAX_ORDER, np.int64)
  sys_len = ref_len = 0
  for hyp, ref in zip(hypotheses, references, strict=True):
    h, r = bleu_tokenize(hyp.lower()), bleu_tokenize(ref.lower())
    sys_len, ref_len = sys_len + len(h), ref_len + len(r)
    for n in range(1, MAX_ORDER + 1):
      hyp_n, ref_n = _ngrams(h, n), _ngrams(r, n)
      correct[n - 1] += sum(min(c, hyp_n[g]) for g, c in ref_n.items())
      total[n - 1] += max(len(h) - n + 1, 0)
  return {"bleu_correct": correct, "bleu_total": total,
          "bleu_sys_len": np.asarray(sys_len, np.int64),
          "bleu_ref_len": np.asarray(ref_len, np.int64)}


def score(stats: dict[str, np.ndarray]) -> float:
  """Corpus BLEU (0-100) of summed `statistics`: the reference's `complete_bleu`
  (a precision with no match is 1 / (2^k * count), k counting such orders; a
  brevity penalty when the hypotheses are shorter)."""
  correct, total = stats["bleu_correct"], stats["bleu_total"]
  precisions, smooth = [0.0] * MAX_ORDER, 1.0
  for i in range(MAX_ORDER):
    if total[i] > 0:
      if correct[i] > 0:
        precisions[i] = int(correct[i]) / int(total[i])
      else:
        smooth *= 2
        precisions[i] = 1.0 / (smooth * int(total[i]))
  geo_mean = 0.0
  if max(precisions) > 0:
    geo_mean = math.exp(sum(math.log(p) for p in precisions if p) / MAX_ORDER)
  ref_len, sys_len = int(stats["bleu_ref_len"]), int(stats["bleu_sys_len"])
  bp = 1.0
  if ref_len:
    ratio = sys_len / ref_len
    bp = 0.0 if ratio <= 0.0 else 1.0 if ratio >= 1.0 else math.exp(1 - 1.0 / ratio)
  return geo_mean * bp * 100.0
