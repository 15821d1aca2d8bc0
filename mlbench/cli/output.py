"""Consoles for human output: stderr by default; no hard wrapping when piped."""

from __future__ import annotations

from rich.console import Console


def console(*, stderr: bool = True) -> Console:
  """A rich console. On a terminal it fits the window; in a pipe or a CI log it
  neither wraps nor truncates at 80 columns, so every value stays greppable."""
  c = Console(stderr=stderr)
  if not c.is_terminal:
    c = Console(stderr=stderr, width=200, soft_wrap=True)
  return c


def note_pending(paths, console: Console) -> None:
  """Says which logs of unfinished runs under `paths` are not counted (validate, compare).

  Only `result_<i>.txt` files are ever read as results; a pending log is a run
  in progress, or the leftover of one that was killed.
  """
  from pathlib import Path

  from mlbench.storage import pending
  from mlbench.config import STALE_AFTER_S

  folders = set()
  for path in map(Path, paths):
    if path.is_dir():
      folders |= {p.parent for p in path.rglob("pending_*.log")}
  for folder in sorted(folders):
    found = pending.scan(folder, stale_after=STALE_AFTER_S)
    stale = [p for p in found if p.abandoned and p.log is not None]
    live = [p for p in found if not p.abandoned and p.log is not None]
    if stale:
      console.print(f"note: ignoring {len(stale)} log(s) of killed runs in {folder} ("
                    + ", ".join(p.log.name for p in stale) + "); `mlbench run` there moves them "
                    "to runs/", highlight=False)
    if live:
      console.print(f"note: ignoring {len(live)} log(s) of runs still in progress in {folder}",
                    highlight=False)


def unfetched(value, local, original):
  """`value` (a JSON-ready report) with the paths of a local copy (`storage.writes.fetched`)
  named as the bucket paths they were copied from."""
  local, original = str(local), str(original).rstrip("/")
  if local == original:
    return value
  if isinstance(value, dict):
    return {k: unfetched(v, local, original) for k, v in value.items()}
  if isinstance(value, list):
    return [unfetched(v, local, original) for v in value]
  if isinstance(value, str) and value.startswith(local):
    return original + value[len(local):]
  return value
