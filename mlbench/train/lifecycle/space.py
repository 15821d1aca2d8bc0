"""Room for a run: the start-up check that the disks it writes to can hold what it writes.

What the runs of one invocation write, by where it goes:

- checkpoints (`--checkpoint-every`, `--resume`): each holds the train state (its bytes,
  from the shapes of the workload's init, nothing allocated) and a copy of the log;
  orbax keeps the newest `KEPT` and writes the next before it deletes the oldest, and the
  checkpoints of a finished run stay: `KEPT` x runs + 1 at the most, in the run folders
  or under `--checkpoint-dir` (a resumed run's own count as kept);
- the log of each run (pending, then the result: a hard link, not a second copy) and its
  TensorBoard scalars, in `--results-dir`: a few kB per evaluation point;
- JAX's compilation cache, where it is on one of those disks: an allowance per program
  (init, train, eval), since a program's size is known only once it is compiled.

Paths on one disk are summed; buckets have no free space to ask and are not counted.
A disk without room for all of it is refused before anything compiles, in one line that
gives both numbers and what they are made of.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from typing import TYPE_CHECKING

from mlbench.storage import paths
from mlbench.errors import UserError
from mlbench.train.lifecycle.runrecord import find_run

if TYPE_CHECKING:
  from mlbench.train.plan import Plan

KEPT = 2  # checkpoint.manager's LatestN
LOG_BYTES = 16 << 10  # the setup lines of a log (hyperparameters and the rest)
POINT_BYTES = 2 << 10  # the lines of one evaluation point, and its TensorBoard scalars
# Per compiled program. An allowance, not a measurement: the mini configs' XLA:CPU programs
# are 0.3-0.5 MiB; an accelerator's programs of a full config are larger.
PROGRAM_BYTES = {"cpu": 4 << 20}
ACCELERATOR_PROGRAM_BYTES = 64 << 20
PROGRAMS = 3


@dataclasses.dataclass(frozen=True)
class Need:
  """Bytes a run writes under `where` (given as the option `option`), for `what`."""

  option: str
  where: paths.Path
  what: str
  bytes: int


def _mib(n: float) -> str:
  return f"{n / 2**20:,.1f} MiB" if n >= 2**20 else f"{n / 2**10:,.0f} KiB"


def state_bytes(plan: Plan) -> int:
  """The bytes of the run's whole train state, from shapes (nothing is allocated)."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from mlbench.train import steps

  shapes = jax.eval_shape(steps.init_fn(plan.workload, plan.cfg, plan.tx),
                          jax.ShapeDtypeStruct((), jnp.uint32))
  total = 0
  for x in jax.tree.leaves(shapes):
    try:
      item = np.dtype(x.dtype).itemsize
    except TypeError:  # A typed PRNG key: its raw data, two uint32.
      item = 8
    total += int(np.prod(x.shape)) * item
  return total


def needs(plan: Plan, *, state: int, cache: paths.Path | None) -> list[Need]:
  """What the plan's runs write, where (`state`: bytes of the train state; `cache`: the
  compilation cache's folder, None when off)."""
  rc = plan.rc
  runs = 1 if rc.resume is not None else rc.runs
  log = LOG_BYTES + POINT_BYTES * len(plan.points)
  out = [Need("--results-dir", rc.results_dir, f"{runs} log(s) and TensorBoard scalars",
              runs * log)]
  if rc.checkpoint_every or rc.resume is not None:
    resumed = find_run(rc.resume)[1] if rc.resume is not None else None
    n = KEPT * runs + 1 - (_steps_in(resumed) if resumed is not None else 0)
    where, option = ((resumed, "--resume") if resumed is not None else
                     (rc.checkpoint_dir, "--checkpoint-dir") if rc.checkpoint_dir is not None
                     else (rc.results_dir, "--results-dir"))
    out.append(Need(option, where, f"checkpoints {n} x {_mib(state + log)} ({KEPT} kept per "
                                   f"run, 1 being written)", n * (state + log)))
  if cache is not None:
    platform = plan.runtime.devices[0].platform
    each = PROGRAM_BYTES.get(platform, ACCELERATOR_PROGRAM_BYTES)
    out.append(Need("--compile-cache", cache, f"compile cache {PROGRAMS} x {_mib(each)} (an "
                                              "allowance per program)", PROGRAMS * each))
  return out


def _steps_in(folder: paths.Path) -> int:
  """Checkpoints already in the folder a run resumes from (they count as kept)."""
  try:
    return min(KEPT, sum(p.name.isdigit() for p in paths.path(folder).iterdir()))
  except OSError:
    return 0


def _disk(where: paths.Path) -> tuple[int, str] | None:
  """(device id, an existing folder on it) of a local path; None for a bucket."""
  if paths.is_remote(where):
    return None
  p = os.path.abspath(os.fspath(where))
  while not os.path.exists(p) and os.path.dirname(p) != p:
    p = os.path.dirname(p)
  return os.stat(p).st_dev, p


def check(need: list[Need]) -> None:
  """Refuses (one line, both numbers) a disk with less free space than is needed on it.

  Raises:
    UserError: "--results-dir r has 3.0 MiB free; this run needs about 13.2 MiB there ...".
  """
  disks: dict[int, tuple[str, list[Need]]] = {}
  for n in need:
    disk = _disk(n.where)
    if disk is not None:
      disks.setdefault(disk[0], (disk[1], []))[1].append(n)
  for existing, on_it in disks.values():
    free = shutil.disk_usage(existing).free
    total = sum(n.bytes for n in on_it)
    if free >= total:
      continue
    names = list(dict.fromkeys(f"{n.option} {n.where}" for n in on_it))
    parts = "; ".join(f"{n.what}: {_mib(n.bytes)}" for n in on_it)
    where = (names[0] + " has" if len(names) == 1 else
             " and ".join(names) + " (one disk) have")
    raise UserError(f"{where} only {_mib(free)} free; this run needs about {_mib(total)} "
                    f"there ({parts}); free some space or choose another folder")
