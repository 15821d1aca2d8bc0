"""Host input pipelines over TFRecords, built by the harness for every workload.

The workload names its files and decodes one record (`InputSpec`); the tuning
lives here, the same for every workload (the recipe of the TPU-pod MLPerf
submissions): files sharded per host, parallel interleave, cache of the
serialized records, shuffle, parallel decode, batches of the per-host size, and
prefetch. Evaluation sets are split per host by example and padded with masked
examples so every host runs the same number of steps and no example is dropped
or counted twice. Batches then move to the devices two at a time.

TensorFlow is imported here (and by the record writer, `mlbench.datasets.records`) on
first use, and kept off any GPU.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mlbench.storage import paths, writes
from mlbench.errors import UserError

MASK = "mask"
MANIFEST = "dataset.json"
"""Written last into a generated dataset folder: its presence means the folder is complete."""


@functools.cache
def tf() -> Any:
  """TensorFlow, imported once, with GPUs hidden so it never takes accelerator memory."""
  import os

  # TF's C++ start-up chatter (oneDNN notices, CPU feature hints) is noise here.
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow

  tensorflow.config.set_visible_devices([], "GPU")
  return tensorflow


@dataclasses.dataclass(frozen=True)
class PipelineOptions:
  """Input-pipeline tuning knobs (the same for every workload).

  Attributes:
    shuffle_buffer: records in the shuffle buffer.
    cycle_length: files read in parallel.
    cache: keep the serialized records in host memory after the first epoch.
    deterministic: produce the same batches for the same seed; off lets
      tf.data hand out whichever element is ready first (faster).
    threads: size of tf.data's private thread pool (None: TF's default).
    autotune: let tf.data's autotuner resize buffers and parallelism. Off by
      default: in TF 2.21 its model thread is not woken when an iterator is
      deleted, so deleting one stalls for up to the autotuner's sleep period
      (21 s seen here, inside the timed region for evaluation iterators).
      Without it, AUTOTUNE parallelism means one call per core.
  """

  shuffle_buffer: int = 16384
  cycle_length: int = 16
  cache: bool = True
  deterministic: bool = True
  threads: int | None = None
  autotune: bool = False


def _options(opts: PipelineOptions) -> Any:
  o = tf().data.Options()
  o.deterministic = opts.deterministic
  o.autotune.enabled = opts.autotune
  o.threading.max_intra_op_parallelism = 1
  if opts.threads:
    o.threading.private_threadpool_size = opts.threads
  return o


def _records(files: Sequence[str], opts: PipelineOptions, *, parallel: bool) -> Any:
  t = tf()
  ds = t.data.Dataset.from_tensor_slices(list(files))
  return ds.interleave(
      lambda f: t.data.TFRecordDataset(f, buffer_size=8 << 20),
      cycle_length=min(opts.cycle_length, len(files)) if parallel else 1, block_length=1,
      **({"num_parallel_calls": t.data.AUTOTUNE, "deterministic": opts.deterministic}
         if parallel else {}))


def train_dataset(files: Sequence[str], decode: Callable[[Any, Any], dict[str, Any]], *,
                  per_host_batch: int, seed: int, host: int, hosts: int,
                  opts: PipelineOptions = PipelineOptions(), skip_batches: int = 0,
                  keep: Callable[[Any], Any] | None = None,
                  pack: Callable[[Iterator[Any]], Iterator[Any]] | None = None) -> Any:
  """An endless, shuffled, decoded, batched tf.data pipeline of this host's files (with
  `pack`, the `PackedBatches` it makes of the decoded examples).

  Args:
    files: every training file; this host reads `files[host::hosts]`.
    decode: the workload's `DecodeFn`.
    per_host_batch: examples per batch on this host.
    seed: run seed; shuffling and augmentation are reproducible from it.
    host, hosts: this process's index and the process count.
    opts: tuning knobs.
    skip_batches: start after this many batches (a resumed run): the same
      batches follow as in a run that never stopped. Records are skipped
      before they are decoded, so skipping costs reading, not decoding.
    keep: records it rejects are skipped (`InputSpec.keep`).
    pack: a packer (`InputSpec.pack`'s) that makes this host's batches of the decoded
      examples, in chunks, in the shuffled order; skipped batches are then packed and
      dropped (a packer carries sequences from step to step, so only replaying it gives
      a resumed run the same batches).
  """
  t = tf()
  mine = sorted(files)[host::hosts]
  if not mine:
    raise UserError(f"{len(files)} training files cannot be split over {hosts} hosts; "
                    "write the dataset in at least as many files as hosts")
  host_seed = seed * 1_000_003 + host
  if not opts.cache:
    mine = list(np.random.default_rng(host_seed).permutation(mine))
  records = _records(mine, opts, parallel=True)
  if keep is not None:
    records = records.filter(keep)
  if opts.cache:
    records = records.cache()
  records = records.shuffle(opts.shuffle_buffer, seed=host_seed,
                            reshuffle_each_iteration=True).repeat()
  seeds = t.data.Dataset.random(seed=host_seed).batch(2)
  ds = t.data.Dataset.zip((records, seeds))
  if skip_batches and pack is None:  # Decoding is one-to-one and batches are full: skip
    ds = ds.skip(skip_batches * per_host_batch)  # whole batches' records.
  ds = ds.map(decode, num_parallel_calls=t.data.AUTOTUNE, deterministic=opts.deterministic)
  if pack is not None:
    chunks = ds.batch(PACK_CHUNK).prefetch(t.data.AUTOTUNE).with_options(_options(opts))
    return PackedBatches(chunks, pack, skip_batches)
  ds = ds.batch(per_host_batch, drop_remainder=True)
  return ds.prefetch(t.data.AUTOTUNE).with_options(_options(opts))


PACK_CHUNK = 64
"""Decoded examples a packer receives at a time (NumPy arrays of that many rows)."""


@dataclasses.dataclass(frozen=True)
class PackedBatches:
  """A packer's batches of a tf.data pipeline of decoded examples in chunks; iterable once
  per run (each iteration starts the pipeline and the packer afresh)."""

  chunks: Any
  pack: Callable[[Iterator[Any]], Iterator[Any]]
  skip: int = 0

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    return itertools.islice(self.pack(self.chunks.as_numpy_iterator()), self.skip, None)


def eval_steps(num_examples: int, per_host_batch: int, hosts: int) -> int:
  """Evaluation steps every host runs so that all `num_examples` are covered."""
  return math.ceil(math.ceil(num_examples / hosts) / per_host_batch)


def eval_dataset(files: Sequence[str], decode: Callable[[Any, Any], dict[str, Any]], *,
                 num_examples: int, per_host_batch: int, host: int, hosts: int,
                 opts: PipelineOptions = PipelineOptions(),
                 keep: Callable[[Any], Any] | None = None) -> Any:
  """This host's share of the evaluation set, padded to `eval_steps` full batches.

  Host h takes examples h, h + hosts, h + 2*hosts, ... of the files read in
  order, so the union over hosts is the whole set exactly once. Real examples
  get `mask` 1; padding (zeros) gets `mask` 0. Records `keep` rejects are not
  part of the set (filtered before sharding).
  """
  t = tf()
  records = _records(sorted(files), opts, parallel=False)
  if keep is not None:
    records = records.filter(keep)
  records = records.shard(hosts, host)
  if opts.cache:
    records = records.cache()
  zero_seed = t.zeros([2], t.int64)
  ds = records.map(lambda r: {**decode(r, zero_seed), MASK: t.constant(1, t.int32)},
                   num_parallel_calls=t.data.AUTOTUNE, deterministic=True)
  pad = t.nest.map_structure(lambda s: t.zeros(s.shape, s.dtype), ds.element_spec)
  steps = eval_steps(num_examples, per_host_batch, hosts)
  ds = ds.concatenate(t.data.Dataset.from_tensors(pad).repeat())
  ds = ds.take(steps * per_host_batch).batch(per_host_batch, drop_remainder=True)
  return ds.prefetch(t.data.AUTOTUNE).with_options(_options(opts))


def numpy_batches(ds: Any) -> Iterator[dict[str, np.ndarray]]:
  """Iterates a tf.data dataset of dicts (or `EvalBatches`, `PackedBatches`) as numpy dicts."""
  return iter(ds) if isinstance(ds, (EvalBatches, PackedBatches)) else ds.as_numpy_iterator()


def _stack(examples: Any, indices: Sequence[int]) -> dict[str, np.ndarray]:
  rows = [examples[i] for i in indices]
  return {k: np.stack([r[k] for r in rows]) for k in rows[0]}


def example_batches(examples: Any, *, per_host_batch: int, host: int, hosts: int,
                    start_step: int = 0) -> Iterator[dict[str, np.ndarray]]:
  """Endless training batches of random-access `examples` (`InputSpec.examples`), in
  index order: step s covers examples [s * B, (s + 1) * B) of the global batch B, and
  this host takes its `host`-th slice (wrapping around at the end)."""
  n, step = len(examples), start_step
  while True:
    first = step * per_host_batch * hosts + host * per_host_batch
    yield _stack(examples, [(first + i) % n for i in range(per_host_batch)])
    step += 1


@dataclasses.dataclass(frozen=True)
class EvalBatches:
  """This host's share of random-access evaluation examples, padded as `eval_dataset`
  pads TFRecords (host h takes examples h, h + hosts, ...; padding has `mask` 0).
  Iterable any number of times."""

  examples: Any
  num_examples: int
  per_host_batch: int
  host: int
  hosts: int

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    if len(self.examples) < self.num_examples:
      raise UserError(f"the evaluation data holds {len(self.examples)} examples; the rules "
                      f"evaluate {self.num_examples}")
    mine = list(range(self.host, self.num_examples, self.hosts))
    steps = eval_steps(self.num_examples, self.per_host_batch, self.hosts)
    for s in range(steps):
      chunk = mine[s * self.per_host_batch:(s + 1) * self.per_host_batch]
      real = len(chunk)
      batch = _stack(self.examples, chunk + [0] * (self.per_host_batch - real))
      for v in batch.values():
        v[real:] = 0
      batch[MASK] = (np.arange(self.per_host_batch) < real).astype(np.int32)
      yield batch


def prefetch(batches: Iterable[Any], put: Callable[[Any], Any], depth: int = 2) -> Iterator[Any]:
  """Keeps `depth` batches in flight to the devices (transfers are asynchronous).

  Yields:
    (host_batch, device_batch) pairs, in order.
  """
  queue: collections.deque = collections.deque()
  for batch in batches:
    queue.append((batch, put(batch)))
    if len(queue) >= depth:
      yield queue.popleft()
  while queue:
    yield queue.popleft()


GENERATE_HINT = "run without --data-dir to generate it"
"""What a user who points --data-dir at a folder without a mini dataset is told."""


def find_files(folder: paths.Path, globs: Sequence[str], *, generated: bool,
               supplied: str) -> list[str]:
  """The files in `folder` that match any of `globs`, sorted (an `InputSpec.files` helper).

  Raises:
    UserError: none match; naming the patterns and what to do: generate the dataset
      (`generated`: the config's data is written by mlbench) or `supplied`.
  """
  found = sorted({str(p) for g in globs for p in folder.glob(g) if p.is_file()})
  if not found:
    raise UserError(f"no {' or '.join(globs)} TFRecord files in {folder}; "
                    f"{GENERATE_HINT if generated else supplied}")
  return found


def is_generated(folder: paths.PathLike) -> bool:
  """Whether `write_dataset` has completed `folder` (a local one or a bucket's)."""
  return (paths.path(folder) / MANIFEST).is_file()


def write_dataset(folder: Path, write: Callable[[Path], Mapping[str, Any]]) -> None:
  """Generates a dataset folder once, atomically, for the mini configs' `prepare`.

  `write(tmp)` fills a fresh temporary folder beside `folder` and returns a
  description of what it wrote, saved as `dataset.json`; then the temporary
  folder becomes `folder` in one rename, so a reader never sees half a dataset
  and an interrupted run leaves nothing behind under the real name. Does
  nothing if `folder` is already complete. If another process finishes first,
  its (identical) folder is kept. In a bucket, where nothing renames a folder,
  the files are written locally, uploaded, and `dataset.json` comes last.
  """
  if is_generated(folder):
    return
  if paths.is_remote(folder):
    _upload_dataset(paths.path(folder), write)
    return
  folder = Path(folder)
  folder.parent.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
  try:
    description = write(tmp)
    (tmp / MANIFEST).write_text(json.dumps(dict(description), indent=2))
    os.rename(tmp, folder)
  except OSError:
    if not is_generated(folder):
      raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def _upload_dataset(folder: paths.Path, write: Callable[[Path], Mapping[str, Any]]) -> None:
  with tempfile.TemporaryDirectory(prefix="mlbench-data-") as tmp:
    description = write(Path(tmp))
    for f in sorted(p for p in Path(tmp).rglob("*") if p.is_file()):
      writes.put(f, folder.joinpath(*f.relative_to(tmp).parts))
  writes.write_atomic(folder / MANIFEST, json.dumps(dict(description), indent=2))
