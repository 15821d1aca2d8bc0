"""Writing where other runs and hosts look: on a local disk, a shared mount or a bucket.

Three kinds of write, each safe against a crash at any moment and against a
second writer:

- `write_new`: create a file only if no file of that name exists, atomically
  (a reader sees nothing or all of it). Locally a hard link of a complete
  temporary file, which fails instead of replacing; on a filesystem without
  hard links (gcsfuse, some FUSE and SMB mounts) the name is claimed by an
  exclusive create (`O_EXCL`) and the empty claim replaced by the complete file
  in one rename. In a bucket, one upload with the precondition "no object of
  this name yet" (`ifGenerationMatch=0`): the object appears whole, and of two
  runs creating the same name exactly one succeeds. Result logs, run records
  and system descriptions are written this way, so nothing is ever clobbered.
- `write_atomic`: replace a file whole (a temporary file renamed over it; an
  upload, which GCS makes visible only once complete): heartbeats, receipts.
- `put`: copy a finished local file to its place (a data shard).
Locally each write is fsynced before its rename or link, and the folder after it
(`replace_synced`, `sync_dir`), so a crash of the machine never leaves a final
name on a file whose bytes are not on the disk.

`fetched` gives a local copy of a bucket folder's logs and descriptions for the
tools that read local files only (the official MLPerf checkers).
"""

from __future__ import annotations

import contextlib
import functools
import os
import pathlib
import shutil
import tempfile
import uuid
from collections.abc import Iterator

from etils import epath

from mlbench.storage import faults, paths
from mlbench.errors import UserError


def _tmp_beside(dst: pathlib.Path) -> pathlib.Path:
  return dst.with_name(f".{dst.name}.{uuid.uuid4().hex[:8]}.tmp")


def _write_synced(path: pathlib.Path, data: bytes) -> None:
  with open(path, "xb") as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())


def sync_dir(folder: paths.PathLike) -> None:
  """Makes the names in a local folder durable (after a rename or link into it)."""
  try:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
  except OSError:  # Not a local folder, or one we may not open: nothing to make durable.
    return
  try:
    os.fsync(fd)
  except OSError:  # Some filesystems (FUSE mounts) do not sync folders.
    pass
  finally:
    os.close(fd)


def replace_synced(src: paths.PathLike, dst: paths.PathLike) -> None:
  """Moves the complete local file `src` to `dst` (same folder) once its bytes are on
  the disk: a crash leaves the old name, or the new one with all of it."""
  with open(src, "rb") as f:
    os.fsync(f.fileno())
  os.replace(src, dst)
  sync_dir(pathlib.Path(dst).parent)


def write_new(dst: paths.PathLike, data: bytes | str | None = None, *,
              src: paths.PathLike | None = None) -> bool:
  """Creates `dst` holding `data` (or the local file `src`'s bytes) unless it exists.

  Returns:
    True if this call created it, False if a file of that name was there.
  """
  if isinstance(data, str):
    data = data.encode("utf-8")
  if paths.is_remote(dst):
    return _create_object(dst, data if src is None else pathlib.Path(src).read_bytes())
  dst = pathlib.Path(dst)
  if src is not None:
    return _link_new(pathlib.Path(src), dst)
  tmp = _tmp_beside(dst)
  try:
    _write_synced(tmp, data)
    return _link_new(tmp, dst)
  finally:
    tmp.unlink(missing_ok=True)


def _link_new(src: pathlib.Path, dst: pathlib.Path) -> bool:
  """Gives `src`'s content the name `dst` unless `dst` exists; never replaces."""
  try:
    os.link(src, dst)
    sync_dir(dst.parent)
    return True
  except FileExistsError:
    return False
  except OSError:  # No hard links on this filesystem.
    pass
  try:
    fd = os.open(dst, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
  except FileExistsError:
    return False
  os.close(fd)
  tmp = _tmp_beside(dst)
  try:
    with open(src, "rb") as f:
      _write_synced(tmp, f.read())
    os.replace(tmp, dst)  # The claim (empty) becomes the whole file in one step.
    sync_dir(dst.parent)
  finally:
    tmp.unlink(missing_ok=True)
  return True


@functools.cache
def _gcs_client():
  try:
    from google.cloud import storage
  except ImportError:
    raise UserError("writing to gs:// needs google-cloud-storage: pip install "
                    "'mlbench[gcs]'") from None
  return storage.Client()


def _create_object(dst: paths.PathLike, data: bytes) -> bool:
  """One upload that succeeds only if no object of that name exists yet."""
  from google.api_core import exceptions

  bucket, name = paths.bucket_of(dst)
  blob = _gcs_client().bucket(bucket.split("://", 1)[1]).blob(name)
  try:  # Transient errors (429, 5xx) are retried with the client's policy, said once.
    blob.upload_from_string(data, if_generation_match=0, retry=faults.gcs_retry(str(dst)))
  except exceptions.PreconditionFailed:
    # The client retries a failed upload; if the first attempt went through after
    # all, the object is ours. Logs are unique (timestamps, seed), so bytes tell.
    return blob.download_as_bytes() == data
  return True


def write_atomic(dst: paths.PathLike, data: bytes | str) -> None:
  """Writes `dst` whole, replacing what was there; a reader never sees half of it."""
  if isinstance(data, str):
    data = data.encode("utf-8")
  if paths.is_remote(dst):
    paths.path(dst).write_bytes(data)  # An object is visible only once uploaded.
    return
  dst = pathlib.Path(dst)
  tmp = _tmp_beside(dst)
  try:
    _write_synced(tmp, data)
    os.replace(tmp, dst)
    sync_dir(dst.parent)
  finally:
    tmp.unlink(missing_ok=True)


def put(src: paths.PathLike, dst: paths.PathLike) -> None:
  """Copies the finished local file `src` to `dst`, replacing it, atomically."""
  if paths.is_remote(dst):
    epath.Path(src).copy(paths.path(dst), overwrite=True)
    return
  dst = pathlib.Path(dst)
  tmp = _tmp_beside(dst)
  try:
    shutil.copyfile(src, tmp)
    replace_synced(tmp, dst)
  finally:
    tmp.unlink(missing_ok=True)


def remove(p: paths.PathLike) -> None:
  """Deletes the file `p` if it is there."""
  paths.path(p).unlink(missing_ok=True)


def check_writable(folder: paths.PathLike, what: str, *, parents: bool = False,
                   min_free_bytes: int = 64 << 20) -> None:
  """Creates `folder` and proves a file can be written there.

  Args:
    parents: create missing parents too; without it the parent must exist, so
      a folder on a mount that is not there is an error, not a new folder on
      the root filesystem. (A bucket has no parents: it must exist.)

  Raises:
    UserError: the bucket or parent is missing (a missing mount?), the folder
      cannot be written, or its filesystem has less than `min_free_bytes` free.
  """
  if paths.is_remote(folder):
    probe = paths.path(folder) / f".write-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with paths.errors(f"cannot write to {what}", folder):
      probe.write_bytes(b"x")
      probe.unlink()
    return
  folder = pathlib.Path(folder)
  if not parents and not folder.exists() and not folder.parent.is_dir():
    raise UserError(f"{what} {folder}: its parent {folder.parent} does not exist (a missing "
                    "mount?); create it or choose another folder")
  try:
    folder.mkdir(parents=parents, exist_ok=True)
    probe = folder / f".write-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    probe.write_bytes(b"x")
    probe.unlink()
    free = shutil.disk_usage(folder).free
  except OSError as e:
    raise UserError(f"cannot write to {what} {folder} ({e.strerror or e}); choose a writable "
                    "folder") from None
  if free < min_free_bytes:
    raise UserError(f"{what} {folder} has only {free / 2**20:.1f} MiB free (at least "
                    f"{min_free_bytes / 2**20:.0f} MiB needed); free some space or choose "
                    "another folder")


def files_under(root: epath.Path, *, skip: tuple[str, ...] = ()) -> Iterator[epath.Path]:
  """Every file below `root`, not descending into folders named in `skip`."""
  for child in sorted(root.iterdir()):
    if child.is_dir():
      if child.name not in skip:
        yield from files_under(child, skip=skip)
    else:
      yield child


# What validate and compare read: logs, system descriptions, scaling.json, pending records.
_FETCHED = (".txt", ".json", ".log")


@contextlib.contextmanager
def fetched(p: paths.PathLike, what: str) -> Iterator[pathlib.Path]:
  """A local copy of `p` (a log, or a folder's logs and descriptions); `p` if local.

  Run folders (`runs/`: checkpoints, partial logs) are not copied: nothing that
  judges results reads them. The copy is laid out as `<tmp>/<bucket>/<name>`.
  """
  if not paths.is_remote(p):
    yield pathlib.Path(p)
    return
  p = paths.path(p, what)
  with tempfile.TemporaryDirectory(prefix="mlbench-fetched-") as tmp:
    bucket, name = paths.bucket_of(p)
    local = pathlib.Path(tmp, bucket.split("://", 1)[1], *name.split("/"))
    with paths.errors(what, p):
      if p.is_file():
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(p.read_bytes())
      elif p.is_dir():
        for f in files_under(p, skip=("runs",)):
          if f.suffix in _FETCHED:
            dst = local.joinpath(*f.relative_to(p).parts)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(f.read_bytes())
      else:
        paths.require_dir(p, what)
    yield local
