"""Paths: names that become paths, paths that may be buckets, and staying inside a root.

Every path mlbench itself lists, reads or writes goes through `etils.epath`, the
path layer orbax and JAX's compilation cache use too: `gs://bucket/folder` works
wherever a local path does, and a local path behaves as it always has.
`pathlib.Path("gs://b/x")` would silently become `gs:/b/x`, so a path that may be
a bucket stays a string or an `epath.Path` from the command line inward
(`path()` makes one). Records themselves are read by tf.data's own file system,
which reads `gs://` natively.

A system, submitter, benchmark or workload name ends up as one folder or file
name under the results dir (`results/<system>/<benchmark>/`,
`systems/<system>.json`). A name like `../../etc/x` or `/tmp/x` would make
those paths leave the results dir, so every such name is checked here (one
path component of safe characters), and every path mlbench writes is resolved
and checked to lie inside its root before anything is written.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import posixpath
import re
from collections.abc import Callable, Iterator
from typing import Union

from etils import epath

from mlbench.errors import UserError

Path = epath.Path
PathLike = Union[str, os.PathLike]

# Letters, digits, '.', '_', '+', '-'; no leading '.' or '-' (hidden files, options),
# at most 128 characters: a single path component on every filesystem we write to.
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
SCHEMES = ("gs",)
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):(/*)(.*)", re.S)


_fresh = False


def _fresh_listings() -> None:
  """Listings of a bucket must show what other hosts wrote a moment ago: gcsfs (the
  client epath uses when TensorFlow's is off) caches listings forever by default.
  Set before the first bucket path is used (epath makes its client on first use)."""
  global _fresh
  if _fresh:
    return
  _fresh = True
  from mlbench.storage import faults

  faults.watch_gcsfs()  # Its retries said once, its tracebacks off the console.
  try:
    import fsspec.config
  except ImportError:
    return
  fsspec.config.conf.setdefault("gcs", {}).setdefault("use_listings_cache", False)


def default_cache_dir() -> pathlib.Path:
  """Where generated datasets, derived checker rules and JAX's compilation cache live by
  default: `$MLBENCH_CACHE_DIR`, else `$XDG_CACHE_HOME/mlbench` (`~/.cache/mlbench`)."""
  env = os.environ.get("MLBENCH_CACHE_DIR")
  if env:
    return pathlib.Path(env)
  base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
  return pathlib.Path(base) / "mlbench"


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


def path(value: PathLike, what: str = "path") -> epath.Path:
  """`value` (a command-line string, a pathlib or epath path) as an `epath.Path`.

  Raises:
    UserError: a bucket URL with one slash (`gs:/b/x`, what pathlib makes of
      `gs://b/x`), one without a bucket, or a scheme mlbench does not write to.
  """
  if isinstance(value, epath.Path):
    return value
  text = os.fspath(value)
  m = _SCHEME.fullmatch(text)
  if m and len(m[1]) > 1:  # A one-letter "scheme" is a Windows drive.
    scheme, slashes, rest = m[1].lower(), m[2], m[3]
    if scheme not in SCHEMES:
      raise UserError(f"{what} {text}: mlbench reads and writes local paths and "
                      f"{', '.join(s + '://' for s in SCHEMES)} buckets only")
    if slashes != "//":
      raise UserError(f"{what} {text}: a bucket path needs two slashes: "
                      f"{scheme}://{rest.lstrip('/')}")
    if not rest.split("/", 1)[0]:
      raise UserError(f"{what} {text}: no bucket named; give {scheme}://BUCKET/FOLDER")
    _fresh_listings()
  return epath.Path(text)


def optional(value: PathLike | None, what: str = "path") -> epath.Path | None:
  """`path(value)`, or None for None."""
  return None if value is None else path(value, what)


def is_remote(p: PathLike) -> bool:
  """Whether `p` is in a bucket (`gs://...`) rather than on a local or mounted disk."""
  return "://" in os.fspath(p)


def bucket_of(p: PathLike) -> tuple[str, str]:
  """(`gs://bucket`, object name) of a bucket path."""
  text = os.fspath(p)
  scheme, rest = text.split("://", 1)
  bucket, _, name = rest.partition("/")
  return f"{scheme}://{bucket}", name


def resolve(p: PathLike) -> epath.Path:
  """An absolute path with links followed (locally); a bucket path as it is."""
  if is_remote(p):
    return path(p)
  return epath.Path(pathlib.Path(p).resolve())


def same(a: PathLike, b: PathLike) -> bool:
  """Whether two paths name the same file or folder."""
  return os.fspath(resolve(a)).rstrip("/") == os.fspath(resolve(b)).rstrip("/")


def inside(root: PathLike, p: PathLike) -> epath.Path:
  """`p`, resolved, after checking that it lies inside `root` (also resolved).

  Locally, symbolic links are followed, so a link pointing out of `root` is
  caught too; a bucket has no links, so its names are compared as written.

  Raises:
    UserError: `p` would be outside `root`.
  """
  if is_remote(root) or is_remote(p):
    real_root = posixpath.normpath(os.fspath(root).split("://", 1)[-1])
    real = posixpath.normpath(os.fspath(p).split("://", 1)[-1])
    if not is_remote(p) or (real != real_root and not real.startswith(real_root + "/")):
      raise UserError(f"{p} is outside {root}; mlbench writes only inside the folder you name")
    return path(p)
  real_root = pathlib.Path(root).resolve()
  real = pathlib.Path(p).resolve()
  if real != real_root and not real.is_relative_to(real_root):
    raise UserError(f"{p} resolves to {real}, outside {root}; mlbench writes only inside "
                    "the folder you name (check the names and links under it)")
  return epath.Path(real)


def size(p: PathLike) -> int:
  """Bytes in the file at `p`."""
  if is_remote(p):
    return int(path(p).stat().length)
  return os.stat(p).st_size


# -- one-line errors ----------------------------------------------------------------
_DENIED = ("Forbidden", "Unauthorized", "PermissionDenied", "RefreshError",
           "DefaultCredentialsError")
_MISSING = ("NotFound",)


def why(e: BaseException) -> str:
  """What went wrong with a storage call, in a few words."""
  name = type(e).__name__
  code = getattr(e, "code", None)
  if isinstance(e, PermissionError) or code in (401, 403) or any(n in name for n in _DENIED):
    return "permission denied"
  if isinstance(e, FileNotFoundError) or code == 404 or any(n in name for n in _MISSING):
    return "not found"
  if code == 429 or "TooManyRequests" in name:
    return "rate limited (HTTP 429)"
  text = getattr(e, "strerror", None) or (str(e).splitlines() or [name])[0]
  return text[:200]


def _missing(p: epath.Path) -> str:
  """What is missing of `p`: the bucket, or the folder in it."""
  if is_remote(p):
    bucket, _ = bucket_of(p)
    if not _exists(epath.Path(bucket)):
      return f"no such bucket ({bucket})"
    return "no such folder or object in the bucket"
  return "no such file or folder"


def _exists(p: epath.Path) -> bool:
  try:
    return p.exists()
  except Exception:  # A bucket we may not list: say what the call said, not that.
    return True


@contextlib.contextmanager
def errors(what: str, p: PathLike) -> Iterator[None]:
  """Turns an error of a storage call on `p` into a one-line `UserError`.

  A missing bucket, a missing folder, a permission denied, a rate limit: each is
  one line naming `what` (the option) and `p`, never a traceback.
  """
  try:
    yield
  except UserError:
    raise
  except Exception as e:  # gcsfs, google-cloud-storage and TensorFlow raise their own types.
    if not (isinstance(e, OSError) or type(e).__module__.split(".")[0] in (
        "google", "gcsfs", "tensorflow", "fsspec", "aiohttp", "requests")):
      raise
    reason = why(e)
    if reason == "not found":
      reason = _missing(path(p))
    raise UserError(f"{what} {p}: {reason}") from None


def require_dir(p: PathLike, what: str) -> epath.Path:
  """`p` as a path, after checking that it is a folder (a bucket prefix that holds objects).

  Raises:
    UserError: "gs://b/x: no such bucket (gs://b)", "... permission denied", ...
  """
  return _require(p, what, lambda q: q.is_dir(), lambda q: q.exists(), "not a folder")


def require_file(p: PathLike, what: str) -> epath.Path:
  """`p` as a path, after checking that it is a file (an object)."""
  return _require(p, what, lambda q: q.is_file(), lambda q: q.is_dir(), "a folder, not a file")


def _require(p: PathLike, what: str, ok: Callable[[epath.Path], bool],
             wrong: Callable[[epath.Path], bool], problem: str) -> epath.Path:
  """`p` as a path if `ok(p)`; a `UserError` saying `problem` if `wrong(p)`, else what is
  missing (storage errors on the way as one line, `errors`)."""
  p = path(p, what)
  with errors(what, p):
    if ok(p):
      return p
    if wrong(p):
      raise UserError(f"{what} {p}: {problem}")
  raise UserError(f"{what} {p}: {_missing(p)}")
