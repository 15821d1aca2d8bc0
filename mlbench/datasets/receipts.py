"""What a prepared folder says about itself: a receipt per finished shard, the manifest.

A shard's receipt, `.mlbench/<shard>.json`, is written (atomically, after its
files) once the shard is complete: its records, units, unreadable inputs, every
file's size and sha256, and the options that shaped its bytes with the versions of
the tools that wrote them (`options`: the tokenizer's sha256, the end-of-document
token, the label map, the shard counts, mlbench's and TensorFlow's or the
tokenizers' versions, ...). A prepare into a folder whose finished shards were
written with other options is refused with the difference, never mixed: one
dataset is written one way. A receipt that does not read back (empty, truncated)
marks no shard finished: that shard is written again, and said so. The manifest,
`mlbench-data.json`, gathers the receipts when every shard is finished; one that
does not read back is a one-line error naming it and the fix.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mlbench.storage import paths, writes
from mlbench.errors import UserError

MANIFEST = "mlbench-data.json"
RECEIPTS = ".mlbench"
_KEYS = {"shard", "records", "units", "unreadable", "files"}


def receipt_path(out: paths.PathLike, shard: Any) -> paths.Path:
  return paths.path(out) / RECEIPTS / f"{shard.name}.json"


def read_receipts(out: paths.PathLike, shards: Sequence[Any]) -> tuple[dict[str, dict],
                                                                        list[str]]:
  """({shard name: receipt} of the receipts that read back, [names of damaged ones])."""
  out = paths.path(out)
  folder = out / RECEIPTS
  listed = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
  present = [s.name for s in shards if f"{s.name}.json" in listed]

  def read(name: str) -> dict | None:
    try:
      got = json.loads((folder / f"{name}.json").read_text())
    except (OSError, ValueError):
      return None
    return got if isinstance(got, dict) and _KEYS <= set(got) else None

  with ThreadPoolExecutor(16) as pool:  # A bucket answers reads in parallel.
    got = dict(zip(present, pool.map(read, present)))
  return ({n: r for n, r in got.items() if r is not None},
          [n for n, r in got.items() if r is None])


def finished(out: paths.PathLike, shards: Sequence[Any],
             receipts: dict[str, dict] | None = None) -> set[str]:
  """The names of the shards whose receipt reads back and whose files are all in place
  (one listing, not a look-up per file: a bucket answers each in tens of milliseconds)."""
  out = paths.path(out)
  if receipts is None:
    receipts = read_receipts(out, shards)[0]
  names = {p.name for p in out.iterdir()} if out.is_dir() else set()
  return {s.name for s in shards
          if s.name in receipts and all(o in names for o in s.outputs)}


def option_differences(receipts: dict[str, dict], options: dict[str, str]) -> list[str]:
  """How the options of the finished shards differ from `options`, one item per option."""
  found: dict[str, str] = {}
  for receipt in receipts.values():
    theirs = receipt.get("options")
    if theirs is None:
      return ["its shards were written by an mlbench that did not record their options"]
    for key in sorted(set(theirs) | set(options)):
      if theirs.get(key) != options.get(key):
        found.setdefault(key, f"{key}: {theirs.get(key, 'unset')} there, "
                              f"{options.get(key, 'unset')} now")
  return list(found.values())


def refuse_other_options(out: paths.PathLike, receipts: dict[str, dict],
                         options: dict[str, str]) -> None:
  """A prepare with other options than the finished shards' is refused, with the difference."""
  differences = option_differences(receipts, options)
  if differences:
    raise UserError(f"--out {out} holds shards prepared with other options ("
                    + "; ".join(differences) + "); prepare into another --out, or delete "
                    f"{out} to prepare it again with these options")


def digest(value: Any) -> str:
  """A short sha256 of a JSON-able value, as options show it."""
  text = json.dumps(value, sort_keys=True, default=str).encode()
  return "sha256 " + hashlib.sha256(text).hexdigest()[:16]


def write_manifest(out: paths.PathLike, shards: Sequence[Any], options: dict[str, str]) -> int:
  """Gathers the receipts of `shards` into the manifest; returns the total record count."""
  out = paths.path(out)
  receipts = list(read_receipts(out, shards)[0].values())
  files = {name: info for r in receipts for name, info in r["files"].items()}
  manifest = {"complete": len(receipts) == len(shards), "planned": len(shards),
              "records": sum(r["records"] for r in receipts), "options": options,
              "shards": {r["shard"]: {"records": r["records"], "files": sorted(r["files"])}
                         for r in receipts},
              "unreadable": [u for r in receipts for u in r["unreadable"]], "files": files}
  writes.write_atomic(out / MANIFEST, json.dumps(manifest, indent=1))
  return manifest["records"]


def read_manifest(out: paths.PathLike) -> dict | None:
  """The manifest of a prepared folder; None where there is none.

  Raises:
    UserError: it does not read back (empty, truncated, not a manifest).
  """
  path = paths.path(out) / MANIFEST
  if not path.is_file():
    return None
  try:
    manifest = json.loads(path.read_text())
  except (UnicodeDecodeError, ValueError) as e:
    raise UserError(f"{path} is damaged ({type(e).__name__}: {str(e)[:80]}); run the same "
                    "`mlbench data prepare` again to rewrite it (finished shards are kept)"
                    ) from None
  if not isinstance(manifest, dict):
    raise UserError(f"{path} is not a manifest this mlbench reads; run the same `mlbench data "
                    "prepare` again to rewrite it (finished shards are kept)")
  return manifest
