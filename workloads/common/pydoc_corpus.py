"""The decoder LMs' mini dataset (llama31_8b, gpt_oss_20b): CPython's own documentation
as Megatron indexed datasets.

Documents are the docstrings of every pure-Python standard-library module (module,
class and function docstrings of one file, read with `ast`, never imported; test
suites, IDLE, tkinter, lib2to3 and the bundled packages left out), then the Python
language reference's help texts (`pydoc_data.topics`, one document per topic), about
2 M characters in all, shipped with every CPython. Every `EVAL_EVERY`-th document is
held out as the validation set. A byte-level BPE vocabulary (Hugging Face
`tokenizers`; no unknown tokens) is trained on the training documents only; each
document is written as its ids followed by `<|endoftext|>` (NeMo's --append-eod, which
the reference's C4 does without: the mini's own choice, which keeps its short documents
apart), into `train_text_document.{bin,idx}` and `validation_text_document.{bin,idx}` with
`tokenizer.json` beside them, in a folder named after the vocabulary (`folder`), which
every workload that reads this corpus at that vocabulary shares. Samples are then built
from these files exactly as from the reference's C4 (`gpt_samples.py`). Written once,
atomically; later runs reuse it.
"""

from __future__ import annotations

import ast
import functools
import platform
import sysconfig
from pathlib import Path

import numpy as np

from mlbench.datasets import indexed
from mlbench.storage import paths
from mlbench.train import data
from workloads.common import llm

EVAL_EVERY = 10
TRAIN_PREFIX = "train_text_document"
EVAL_PREFIX = "validation_text_document"
FOLDER = "pydoc-megatron"
_SKIPPED = {"site-packages", "dist-packages", "test", "idlelib", "lib2to3", "tkinter",
            "turtledemo", "ensurepip", "__pycache__"}


def docstrings(path: Path) -> str:
  """The docstrings of one source file, in source order, separated by blank lines."""
  try:
    tree = ast.parse(path.read_text(encoding="utf-8"))
  except (SyntaxError, UnicodeDecodeError, ValueError):
    return ""
  kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
  found = [n for n in ast.walk(tree) if isinstance(n, kinds)]
  found.sort(key=lambda n: getattr(n, "lineno", 0))
  return "\n\n".join(d for n in found if (d := ast.get_docstring(n)))


def documents() -> list[tuple[str, str]]:
  """(name, text) of every document: stdlib modules by path, then pydoc topics by name."""
  from pydoc_data.topics import topics

  root = Path(sysconfig.get_paths()["stdlib"])
  out = []
  for path in sorted(root.rglob("*.py")):
    rel = path.relative_to(root)
    if _SKIPPED & set(rel.parts) or "tests" in rel.parts:
      continue
    if text := docstrings(path):
      out.append((str(rel), text))
  return out + [(f"topic:{name}", topics[name]) for name in sorted(topics)]


def split(docs: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
  """(training texts, held-out texts): every EVAL_EVERY-th document is held out."""
  train = [t for i, (_, t) in enumerate(docs) if i % EVAL_EVERY != EVAL_EVERY - 1]
  held_out = [t for i, (_, t) in enumerate(docs) if i % EVAL_EVERY == EVAL_EVERY - 1]
  return train, held_out


def encode(tokenizer, texts: list[str]) -> list[np.ndarray]:
  """Every text's ids followed by `<|endoftext|>`."""
  end = tokenizer.token_to_id(llm.END_OF_TEXT)
  return [np.asarray([*e.ids, end], np.int64) for e in tokenizer.encode_batch(texts)]


def folder(data_dir: Path, vocab_size: int) -> Path:
  """Where the corpus at `vocab_size` tokens is written under `data_dir`."""
  return paths.path(data_dir) / f"{FOLDER}-v{vocab_size}"


def prepare(data_dir: Path, vocab_size: int) -> None:
  """Writes the corpus under `data_dir` (`folder`) unless it is already there."""
  data.write_dataset(folder(data_dir, vocab_size), functools.partial(_write, vocab_size))


def _write(vocab_size: int, out: Path) -> dict[str, object]:
  docs = documents()
  train_texts, eval_texts = split(docs)
  tokenizer = llm.train_tokenizer(train_texts, vocab_size)
  dtype = np.uint16 if tokenizer.get_vocab_size() < 65500 else np.int32
  counts = {}
  for prefix, texts in ((TRAIN_PREFIX, train_texts), (EVAL_PREFIX, eval_texts)):
    ids = encode(tokenizer, texts)
    indexed.write(out / prefix, ids, dtype)
    counts[prefix] = {"documents": len(ids), "tokens": int(sum(len(i) for i in ids))}
  tokenizer.save(str(out / "tokenizer.json"))
  return {"source": f"docstrings of the standard library and pydoc_data.topics of CPython "
                    f"{platform.python_version()}",
          "held_out": f"every {EVAL_EVERY}th document", "vocab_size": tokenizer.get_vocab_size(),
          **counts}
