"""The mini dataset: English-German pairs from the Unicode CLDR, as MLPerf WMT TFRecords.

babel ships the Common Locale Data Repository: human translations of country,
language and currency names, month and weekday names, unit and duration
patterns, and the grammar of lists, dates and amounts. Each pair is one CLDR
rendering of the same value in English and German: "Tuesday, March 5, 2024" /
"Dienstag, 5. März 2024", "Germany, France, and Spain" / "Deutschland,
Frankreich und Spanien", "12.50 euros" / "12,50 Euro", "3 days" / "3 Tage".
The values are drawn at random (seeded), the texts are CLDR's. Pairs are
unique by source; a random share is held out for evaluation.

A shared BPE vocabulary (Hugging Face `tokenizers`, SentencePiece-style
word-boundary marks, so decoding restores the text exactly) is trained on a
separate draw of pairs; pairs longer than `max_length` tokens under it are
discarded. Examples are written in the MLPerf WMT schema: `inputs` and
`targets` as token ids ending in EOS (1), pad 0, in `train-0000i-of-00008` and
`dev-00000-of-00001`, with `tokenizer.json`. The folder is written once,
atomically (`mlbench.train.data.write_dataset`).
"""

from __future__ import annotations

import datetime
import functools
import random
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from mlbench.storage import paths
from mlbench.datasets import records
from mlbench.train import data
from workloads.transformer import vocab
from workloads.transformer.config import Source, TransformerConfig

SEED = 2020
LOCALES = ("en", "de")


def _names(attr: str) -> list[tuple[str, str]]:
  """(English, German) display names CLDR has in both languages."""
  from babel import Locale

  en, de = (getattr(Locale(code), attr) for code in LOCALES)
  return sorted((en[k], de[k]) for k in en if k in de and en[k] and de[k])


@functools.cache
def _tables() -> dict[str, list]:
  from babel import Locale
  from babel.localedata import load

  units = sorted(u for u in load("en")["unit_patterns"] if u.count("-") == 1)
  currencies = sorted(c for c in Locale("en").currencies if c in Locale("de").currencies)
  return {"territories": _names("territories"), "languages": _names("languages"),
          "currencies": currencies, "units": units}


def _date(rng: random.Random) -> tuple[str, ...]:
  from babel.dates import format_date

  day = datetime.date(1900, 1, 1) + datetime.timedelta(days=rng.randrange(73_000))
  style = rng.choice(("full", "long", "medium"))
  return tuple(format_date(day, style, locale=loc) for loc in LOCALES)


def _time(rng: random.Random) -> tuple[str, ...]:
  from babel.dates import format_time

  at = datetime.time(rng.randrange(24), rng.randrange(60))
  return tuple(format_time(at, "short", locale=loc) for loc in LOCALES)


def _list(rng: random.Random, table: str) -> tuple[str, ...]:
  from babel.lists import format_list

  items = rng.sample(_tables()[table], rng.choice((1, 2, 2, 3)))
  return tuple(format_list([it[i] for it in items], locale=loc) for i, loc in enumerate(LOCALES))


def _amount(rng: random.Random) -> tuple[str, ...]:
  from babel.numbers import format_currency

  code = rng.choice(_tables()["currencies"])
  value = rng.choice((rng.randrange(1, 100), round(rng.uniform(1, 1000), 2)))
  return tuple(format_currency(value, code, format_type="name", locale=loc) for loc in LOCALES)


def _measure(rng: random.Random) -> tuple[str, ...]:
  from babel.units import format_unit

  unit = rng.choice(_tables()["units"])
  value = rng.choice((1, 2, rng.randrange(3, 1000)))
  return tuple(format_unit(value, unit, length="long", locale=loc) for loc in LOCALES)


def _duration(rng: random.Random) -> tuple[str, ...]:
  from babel.dates import format_timedelta

  span = datetime.timedelta(seconds=rng.randrange(1, 400 * 86_400))
  return tuple(format_timedelta(span, threshold=2, locale=loc) for loc in LOCALES)


KINDS: tuple[tuple[Callable[[random.Random], tuple[str, ...]], int], ...] = (
    (_date, 5), (_time, 1), (functools.partial(_list, table="territories"), 2),
    (functools.partial(_list, table="languages"), 1), (_amount, 3), (_measure, 3),
    (_duration, 2))


def _clean(text: str) -> str:
  """NFKC (CLDR uses non-breaking and narrow spaces), single spaces."""
  return " ".join(unicodedata.normalize("NFKC", text).split())


def pairs(count: int, seed: int = SEED, keep: Callable[[str, str], bool] = lambda en, de: True
          ) -> list[tuple[str, str]]:
  """`count` distinct (English, German) pairs that `keep` accepts, drawn from `KINDS`
  by weight."""
  rng = random.Random(seed)
  makers = [k for k, w in KINDS for _ in range(w)]
  out: dict[str, str] = {}
  for _ in range(count * 50):
    if len(out) == count:
      break
    en, de = (_clean(t) for t in rng.choice(makers)(rng))
    if en not in out and keep(en, de):
      out[en] = de
  if len(out) < count:
    raise ValueError(f"CLDR yields only {len(out)} distinct pairs, {count} asked for")
  return list(out.items())


def prepare(cfg: TransformerConfig, folder: Path) -> None:
  """Writes the CLDR TFRecords into `folder` (`input_pipeline.dataset_dir`) unless they are
  already there. Does nothing for configs that read the MLPerf WMT data, which must be
  supplied."""
  if cfg.data.source is not Source.CLDR:
    return
  data.write_dataset(paths.path(folder), functools.partial(_write, cfg))


def _examples(tok, rows: list[tuple[str, str]]) -> Iterator[dict[str, np.ndarray]]:
  for en, de in rows:
    yield {"inputs": np.asarray(vocab.encode(tok, en), np.int64),
           "targets": np.asarray(vocab.encode(tok, de), np.int64)}


def split(cfg: TransformerConfig, tok: Any) -> tuple[list[tuple[str, str]], ...]:
  """(train, eval) pairs of the config that fit in `max_length` tokens under `tok`."""
  d = cfg.data
  fits = lambda en, de: max(len(vocab.encode(tok, t)) for t in (en, de)) <= d.max_length
  every = pairs(d.train_examples + d.eval_examples, keep=fits)
  random.Random(SEED + 1).shuffle(every)
  return every[d.eval_examples:], every[:d.eval_examples]


def _write(cfg: TransformerConfig, folder: Path) -> dict[str, object]:
  """The BPE is trained on a separate draw of the generator (seed + 2), so the
  data can be filtered with it: pairs longer than `max_length` tokens (EOS
  included) on either side are discarded (logged as method `discard`)."""
  d = cfg.data
  tok = vocab.train([t for pair in pairs(d.train_examples, SEED + 2) for t in pair],
                    cfg.model.vocab_size)
  train, evals = split(cfg, tok)
  tok.save(str(folder / vocab.TOKENIZER_FILE))
  records.write_shards(str(folder / "train-{index:05d}-of-{count:05d}"),
                       _examples(tok, train), num_shards=8)
  records.write_shards(str(folder / "dev-{index:05d}-of-{count:05d}"),
                       _examples(tok, evals), num_shards=1)
  lengths = [len(vocab.encode(tok, t)) for pair in train for t in pair]
  import babel

  return {"source": f"Unicode CLDR via babel {babel.__version__}, en -> de",
          "train_examples": len(train), "eval_examples": len(evals),
          "vocab_size": tok.get_vocab_size(), "max_length": d.max_length,
          "mean_tokens_per_side": round(float(np.mean(lengths)), 2), "seed": SEED}
