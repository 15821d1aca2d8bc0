"""Subword vocabularies: token ids <-> text.

Two formats, picked by the file:
* `tokenizer.json`: a Hugging Face `tokenizers` BPE with SentencePiece-style
  word-boundary marks (the mini config trains one on its CLDR pairs);
* a tensor2tensor `SubwordTextEncoder` vocabulary (one quoted subtoken per
  line, such as the MLPerf WMT `vocab.ende.32768`): decoding joins the
  subtokens, splits at the `_` end-of-token marks, unescapes, and puts a space
  between two neighbouring alphanumeric tokens, as tensor2tensor does.
Both reserve id 0 for padding and id 1 for EOS.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from mlbench.storage import paths

PAD, EOS, UNK = 0, 1, 2
SPECIAL = ("<pad>", "<EOS>", "<unk>")
TOKENIZER_FILE = "tokenizer.json"


class Vocabulary(Protocol):
  def decode(self, ids: Sequence[int]) -> str:
    """Text of `ids` up to the first EOS; padding ignored."""
    ...


def train(texts: Sequence[str], size: int) -> Any:
  """A BPE of `size` tokens trained on `texts`, with `SPECIAL` as ids 0, 1, 2."""
  from tokenizers import SentencePieceBPETokenizer

  tok = SentencePieceBPETokenizer()
  tok.train_from_iterator(list(texts), vocab_size=size, min_frequency=1,
                          special_tokens=list(SPECIAL), show_progress=False)
  got = [tok.token_to_id(t) for t in SPECIAL]
  if got != [PAD, EOS, UNK]:
    raise ValueError(f"special tokens got ids {got}, expected 0, 1, 2")
  return tok


def encode(tok: Any, text: str) -> list[int]:
  """Token ids of `text` followed by EOS."""
  return [*tok.encode(text).ids, EOS]


def _until_eos(ids: Sequence[int]) -> list[int]:
  out = []
  for i in ids:
    if int(i) == EOS:
      break
    if int(i) != PAD:
      out.append(int(i))
  return out


class BpeVocabulary:
  """A `tokenizers` tokenizer.json."""

  def __init__(self, path: Path):
    from tokenizers import Tokenizer

    self._tok = Tokenizer.from_str(paths.path(path).read_text(encoding="utf-8"))

  def decode(self, ids: Sequence[int]) -> str:
    return self._tok.decode(_until_eos(ids))


_UNESCAPE = re.compile(r"\\u|\\\\|\\([0-9]+);")


def _unescape(token: str) -> str:
  def one(m: re.Match) -> str:
    if m.group(1) is None:
      return "_" if m.group(0) == "\\u" else "\\"
    try:
      return chr(int(m.group(1)))
    except (ValueError, OverflowError):
      return "\u3013"  # tensor2tensor's replacement for a bad escape
  return _UNESCAPE.sub(one, token)


def _is_alnum(ch: str) -> bool:
  return unicodedata.category(ch)[0] in "LN"


class SubwordVocabulary:
  """A tensor2tensor SubwordTextEncoder vocabulary file.

  `encode` is the reference's `Subtokenizer.encode` (mlcommons/training aa344c7f
  retired_benchmarks/transformer/tensorflow/transformer/utils/tokenizer.py L128-151):
  the text split where letters-and-digits meet other characters, a lone space between
  two words dropped (L224-240); each token escaped (`\\` for a backslash, `\\u` for
  `_`, `\\N;` for a character outside the vocabulary's alphabet or a newline) and
  ended by `_` (L254-272); then split greedily into the longest known subtokens
  (L372-391). The alphabet is every character of every subtoken plus the escape
  characters (L438-445).
  """

  def __init__(self, path: Path):
    lines = paths.path(path).read_text(encoding="utf-8").splitlines()
    self._subtokens = [ln.strip()[1:-1] if ln.strip()[:1] in "'\"" else ln.strip()
                       for ln in lines]
    self._ids = {t: i for i, t in enumerate(self._subtokens)}  # the last of twins, as L367-369
    self._alphabet = {c for t in self._subtokens for c in t} | set("\\_u;0123456789")
    self._longest = max(map(len, self._subtokens), default=1)

  def encode(self, text: str) -> list[int]:
    """Subtoken ids of `text` (no EOS)."""
    out = []
    for token in _split_tokens(text):
      escaped = token.replace("\\", "\\\\").replace("_", "\\u")
      escaped = "".join(c if c in self._alphabet and c != "\n" else f"\\{ord(c)};"
                        for c in escaped) + "_"
      start = 0
      while start < len(escaped):
        end = next((e for e in range(min(len(escaped), start + self._longest), start, -1)
                    if escaped[start:e] in self._ids), None)
        if end is None:
          raise ValueError(f"{escaped!r} cannot be split into this vocabulary's subtokens")
        out.append(self._ids[escaped[start:end]])
        start = end
    return out

  def decode(self, ids: Sequence[int]) -> str:
    joined = "".join(self._subtokens[i] for i in _until_eos(ids) if i < len(self._subtokens))
    tokens = [_unescape(t) for t in joined.split("_") if t]
    out = []
    for i, token in enumerate(tokens):
      if i and _is_alnum(tokens[i - 1][0]) and _is_alnum(token[0]):
        out.append(" ")
      out.append(token)
    return "".join(out)


def _split_tokens(text: str) -> list[str]:
  """Runs of letters-and-digits and runs of other characters; a single space between
  two runs is dropped unless it opens the text (decoding puts it back)."""
  tokens, start = [], 0
  for pos in range(1, len(text)):
    if _is_alnum(text[pos]) != _is_alnum(text[pos - 1]):
      if text[start:pos] != " " or start == 0:
        tokens.append(text[start:pos])
      start = pos
  return [*tokens, text[start:]] if text else []


class IdVocabulary:
  """No vocabulary file (synthetic batches, compiling from shapes): every id is
  its own word, so BLEU is computed over id sequences."""

  def decode(self, ids: Sequence[int]) -> str:
    return " ".join(str(i) for i in _until_eos(ids))


@functools.cache
def load(path: str) -> Vocabulary:
  """The vocabulary at `path` (format by name: *.json is a `tokenizers` file);
  '' gives `IdVocabulary`."""
  if not path:
    return IdVocabulary()
  p = paths.path(path)
  return BpeVocabulary(p) if p.suffix == ".json" else SubwordVocabulary(p)
