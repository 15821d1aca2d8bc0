"""Names that become paths, and paths that must stay inside the folder the user named.

A system, submitter, benchmark or workload name ends up as one folder or file
name under the results dir (`results/<system>/<benchmark>/`,
`systems/<system>.json`). A name like `../../etc/x` or `/tmp/x` would make
those paths leave the results dir, so every such name is checked here (one
path component of safe characters), and every path mlbench writes is resolved
and checked to lie inside its root before anything is written.
"""

from __future__ import annotations

import re
from pathlib import Path

from mlbench.errors import UserError

# Letters, digits, '.', '_', '+', '-'; no leading '.' or '-' (hidden files, options),
# at most 128 characters: a single path component on every filesystem we write to.
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")


def check_name(what: str, name: str) -> str:
  """Returns `name` if it is one safe path component.

  Args:
    what: how the user gave it, for the message (e.g. "--system").

  Raises:
    UserError: the name is empty, too long, has a path separator, `..`, a NUL,
      a newline or any other character outside `A-Za-z0-9._+-`.
  """
  if not isinstance(name, str) or not _SAFE.fullmatch(name) or name in (".", ".."):
    raise UserError(f"{what} {name!r} is not a usable name: use 1 to 128 letters, digits, "
                    "'.', '_', '+' or '-', starting with a letter or digit (it becomes a "
                    "folder name)")
  return name


def inside(root: Path, path: Path) -> Path:
  """`path`, resolved, after checking that it lies inside `root` (also resolved).

  Symbolic links are followed, so a link pointing out of `root` is caught too.

  Raises:
    UserError: `path` would be outside `root`.
  """
  real_root = Path(root).resolve()
  real = Path(path).resolve()
  if real != real_root and not real.is_relative_to(real_root):
    raise UserError(f"{path} resolves to {real}, outside {root}; mlbench writes only inside "
                    "the folder you name (check the names and links under it)")
  return real
