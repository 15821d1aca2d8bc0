"""What a compile that does not fit says: XLA's compile-time out-of-memory as one line with
what to try (weight-update sharding, a model axis, remat where the config has it, a batch
that fits by XLA's own figures)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from mlbench import fields
from mlbench.errors import UserError

if TYPE_CHECKING:
  from mlbench.train.plan import Plan


class DoesNotFit(UserError):
  """XLA's compile-time out-of-memory, as one line with what to try; `need_bytes` and
  `have_bytes` per device where XLA said them."""

  def __init__(self, message: str, need_bytes: float | None = None,
               have_bytes: float | None = None):
    super().__init__(message)
    self.need_bytes, self.have_bytes = need_bytes, have_bytes


_OOM = re.compile(r"required for HLO temporaries \(([\d.]+)([KMGT]?)\) exceeds available HBM "
                  r"\(([\d.]+)([KMGT]?)\)")
_UNIT = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def does_not_fit(plan: Plan, where: str, error: Exception) -> DoesNotFit:
  """The one-line error for XLA's compile-time out-of-memory, with what to try."""
  data = int(plan.mesh.shape.get("data", 1))
  m = _OOM.search(str(error))
  need, smaller = "", max(data, plan.gbs // 2 // data * data)
  need_b = have_b = None
  if m:
    need_b = float(m.group(1)) * _UNIT[m.group(2)]
    have_b = float(m.group(3)) * _UNIT[m.group(4)]
    need = f": {need_b / 2**30:,.1f} GiB of temporaries per device, {have_b / 2**30:,.1f} GiB of HBM"
    # Temporaries grow about linearly with the per-device batch.
    smaller = max(data, int(plan.gbs * have_b / need_b * 0.8) // data * data)
  batch = (f", or a smaller per-chip batch (--set global_batch_size={smaller})"
           if smaller < plan.gbs else " (the batch is already one example per data shard)")
  return DoesNotFit(
      f"{plan.workload.name} --config {plan.config_name} at global batch {plan.gbs} does not "
      f"fit on {where}{need}; try --weight-update-sharding, a model axis (--mesh data=N,model=M)"
      f"{remat_hint(plan.cfg)}{batch}", need_b, have_b)


def remat_hint(cfg: Any) -> str:
  """`, remat (--set model.remat=full)` where the config has that key, else nothing: a hint
  to set a key the workload lacks would only be refused as unknown."""
  remat = fields.REMAT.get(cfg)
  if remat is None or remat is fields.Remat.FULL:
    return ""
  return f", remat (--set {fields.REMAT.key}=full)"
