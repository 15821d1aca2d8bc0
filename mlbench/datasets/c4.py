"""C4 json lines into the Megatron `.bin`/`.idx` datasets the llama31_8b workload reads.

Each input file (`{"text": ...}` per line, plain or gzipped, as allenai/c4 ships
`c4-train.00000-of-01024.json.gz`) becomes one dataset `<name>_text_document` in the
output folder, which is how NeMo's `preprocess_data_for_megatron.py --output-prefix
<name>` names it and how the workload's config names its files
(`c4-train.en_6_text_document`, `c4-validation-91205-samples.en_text_document`). One
document per line, one sequence per document, tokenised with the user's Hugging Face
`tokenizer.json`, exactly as the reference writes them: no special token added, no
end-of-document token appended, and a document with no tokens left out. The reference
runs NeMo's script without `--append-eod` (mlcommons/training aa344c7f
small_llm_pretraining/nemo/utils/preprocess.sh L19-23 and L29-33), whose flag is off by
default and whose Hugging Face tokenizer adds no special tokens (NVIDIA/NeMo v2.1.0,
633cb602: scripts/nlp_language_modeling/preprocess_data_for_megatron.py L181-182, L240,
L348-349; nemo/collections/common/tokenizers/huggingface/auto_tokenizer.py L203-204,
L222-225). `--eod TOKEN` (or `auto`) appends one anyway, for other models' data. Token
ids are uint16 when the vocabulary fits, int32 otherwise (Megatron's rule). Nothing is
downloaded.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from mlbench.datasets import shards
from mlbench.errors import UserError

SUFFIX = "_text_document"
# The end-of-document tokens of the tokenizers the references use, tried in order.
EOD_CANDIDATES = ("<|end_of_text|>", "</s>", "<|endoftext|>", "<eos>")
_BATCH = 1024
_TOKENIZERS: dict[str, object] = {}


@dataclasses.dataclass(frozen=True)
class Task:
  """One input file to tokenise."""

  source: str
  tokenizer: str
  eod: int | None
  dtype: str


def inputs(raw: Path) -> list[Path]:
  """The json / json.gz files under `raw`, sorted; a one-line error when there are none."""
  raw = Path(raw)
  if not raw.is_dir():
    raise UserError(f"--raw {raw} is not a folder; expected a folder of C4 json lines files "
                    "(c4-train.00000-of-01024.json.gz, ...)")
  found = sorted(p for p in raw.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz")))
  if not found:
    raise UserError(f"no *.json or *.json.gz files under {raw}; expected C4 json lines files "
                    "with one {\"text\": ...} object per line (c4-train.00000-of-01024.json.gz)")
  return found


def output_name(source: Path) -> str:
  name = source.name
  return name[: -len(".json.gz")] if name.endswith(".json.gz") else name[: -len(".json")]


def _tokenizer(path: str):
  if path not in _TOKENIZERS:
    from tokenizers import Tokenizer

    _TOKENIZERS[path] = Tokenizer.from_file(path)
  return _TOKENIZERS[path]


def load_tokenizer(path: Path, eod: str | None) -> tuple[int, int | None]:
  """(vocabulary size, end-of-document id) of a `tokenizer.json`; one-line errors."""
  if not Path(path).is_file():
    raise UserError(f"--tokenizer {path} does not exist; give the Hugging Face tokenizer.json "
                    "of the model (for Llama 3.1 8B, the one in its checkpoint folder)")
  try:
    tok = _tokenizer(str(path))
  except Exception as e:  # noqa: BLE001 - the Rust library raises plain Exception
    raise UserError(f"--tokenizer {path} is not a Hugging Face tokenizer.json ({e})") from None
  vocab = tok.get_vocab_size(with_added_tokens=True)
  if eod in (None, "none"):  # the reference: no end-of-document token
    return vocab, None
  names = EOD_CANDIDATES if eod == "auto" else (eod,)
  for name in names:
    if (i := tok.token_to_id(name)) is not None:
      return vocab, i
  raise UserError(f"the tokenizer has no end-of-document token {' or '.join(names)}; name it "
                  "with --eod TOKEN, or pass --eod none")


def _lines(path: Path) -> Iterator[str]:
  opener = gzip.open if path.name.endswith(".gz") else open
  with opener(path, "rt", encoding="utf-8") as f:
    for line in f:
      if line.strip():
        yield json.loads(line)["text"]


def _documents(task: Task, counts: list[int]) -> Iterator[np.ndarray]:
  tok = _tokenizer(task.tokenizer)
  tail = [task.eod] if task.eod is not None else []
  batch: list[str] = []
  for text in _lines(Path(task.source)):
    batch.append(text)
    if len(batch) == _BATCH:
      yield from _encode(tok, batch, tail, counts)
      batch = []
  yield from _encode(tok, batch, tail, counts)


def _encode(tok, batch: list[str], tail: list[int], counts: list[int]) -> Iterator[np.ndarray]:
  for enc in tok.encode_batch(batch, add_special_tokens=False) if batch else []:
    if not enc.ids:  # NeMo writes no document for a text without tokens
      continue
    ids = np.asarray(enc.ids + tail)
    counts[0] += ids.size
    yield ids


def write_shard(task: Task, tmps: list[Path]) -> shards.Written:
  """Tokenises one file into `tmps` = [.bin, .idx] (the worker of `shards.run`)."""
  from mlbench.datasets import indexed

  counts = [0]
  bin_tmp, idx_tmp = tmps
  try:
    # indexed.write names its files prefix.bin / prefix.idx; write beside, then move.
    prefix = bin_tmp.with_name(bin_tmp.name + ".w")
    docs = indexed.write(prefix, _documents(task, counts), dtype=np.dtype(task.dtype))
    Path(str(prefix) + ".bin").rename(bin_tmp)
    Path(str(prefix) + ".idx").rename(idx_tmp)
  except (OSError, EOFError, UnicodeDecodeError, ValueError, KeyError, TypeError,
          zlib.error) as e:
    for ext in (".bin", ".idx"):
      Path(str(bin_tmp) + ".w" + ext).unlink(missing_ok=True)
    raise shards.Unreadable(f"{task.source}: {type(e).__name__}: {e}") from None
  return shards.Written(records=docs, units=counts[0])


def shaping(planned: list[shards.Shard]) -> dict[str, str]:
  """The options that shape the tokens: which tokenizer (its file's sha256), which
  end-of-document token, which token dtype."""
  if not planned:
    return {}
  task = planned[0].task
  return {"tokenizer": "sha256 " + shards.sha256(task.tokenizer)[:16],
          "end of document": "none" if task.eod is None else f"token id {task.eod}",
          "token dtype": task.dtype}


def plan(raw: Path, out: Path, tokenizer: Path, eod: str | None) -> list[shards.Shard]:
  """One shard per input file, named after it."""
  vocab, eod_id = load_tokenizer(tokenizer, eod)
  dtype = "uint16" if vocab < 65500 else "int32"
  result = []
  for source in inputs(raw):
    name = output_name(source) + SUFFIX
    result.append(shards.Shard(name, (name + ".bin", name + ".idx"),
                               Task(str(source), str(Path(tokenizer).resolve()), eod_id, dtype),
                               units=source.stat().st_size))
  return result
