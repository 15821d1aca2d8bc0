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
