"""The reference's pretrained backbone: torchvision's ImageNet ResNet-34 weights.

The MLPerf SSD reference starts from `resnet34-333f7ec4.pth`
(mlcommons/training retired_benchmarks/ssd-v1/download_resnet34_backbone.sh,
loaded by ssd/base_model.py L58-61 and cut after layer3, L63-69). mlbench reads
those weights from a `.npz` of plain arrays under torchvision's state-dict
names (`conv1.weight`, `layer1.0.bn1.running_mean`, ...): `np.load` with
`allow_pickle=False` executes nothing stored in the file, and training needs no
torch. Make the `.npz` once, where torch is installed, with

    python -m workloads.ssd.backbone resnet34-333f7ec4.pth resnet34.npz

(`torch.load(weights_only=True)`, which also refuses to run code from the file).
"""

from __future__ import annotations

import sys
import zipfile
from typing import Any

import numpy as np

from mlbench.storage import paths
from mlbench.errors import UserError
from workloads.ssd.config import ModelConfig


def _conv(flax: str, torch: str) -> dict[str, str]:
  return {f"params/{flax}/kernel": f"{torch}.weight"}


def _bn(flax: str, torch: str) -> dict[str, str]:
  return {f"params/{flax}/scale": f"{torch}.weight", f"params/{flax}/bias": f"{torch}.bias",
          f"batch_stats/{flax}/mean": f"{torch}.running_mean",
          f"batch_stats/{flax}/var": f"{torch}.running_var"}


def torchvision_names(cfg: ModelConfig) -> dict[str, str]:
  """'params/backbone/...' or 'batch_stats/backbone/...' path -> torchvision name."""
  out = _conv("backbone/stem_conv", "conv1") | _bn("backbone/stem_bn", "bn1")
  for s, blocks in enumerate(cfg.stage_sizes):
    for b in range(blocks):
      flax, torch = f"backbone/stage{s + 1}_block{b + 1}", f"layer{s + 1}.{b}"
      out |= _conv(f"{flax}/conv1", f"{torch}.conv1") | _bn(f"{flax}/bn1", f"{torch}.bn1")
      out |= _conv(f"{flax}/conv2", f"{torch}.conv2") | _bn(f"{flax}/bn2", f"{torch}.bn2")
      if b == 0 and (s > 0 or cfg.stage_strides[0] != 1):  # the model's projections
        out |= (_conv(f"{flax}/proj_conv", f"{torch}.downsample.0")
                | _bn(f"{flax}/proj_bn", f"{torch}.downsample.1"))
  return out


def _as_flax(value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  """torch conv weights are [out, in, kh, kw]; flax kernels [kh, kw, in, out]."""
  if value.ndim == 4:
    value = value.transpose(2, 3, 1, 0)
  return np.asarray(value, np.float32).reshape(shape)


def read(cfg: ModelConfig, path: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
  """path -> array for every backbone path in `shapes`, from the `.npz` at `path`;
  a `UserError` names what is missing or mis-shaped."""
  names = torchvision_names(cfg)
  try:
    with paths.path(path).open("rb") as fh, np.load(fh, allow_pickle=False) as f:
      arrays = {k: f[k] for k in f.files}
  except (OSError, ValueError, zipfile.BadZipFile) as e:
    raise UserError(f"cannot read the backbone weights '{path}' ({e}); give a .npz made by "
                    "`python -m workloads.ssd.backbone resnet34-333f7ec4.pth OUT.npz`") from None
  out, bad = {}, []
  for flax_path, torch_name in names.items():
    want = shapes[flax_path]
    if torch_name not in arrays:
      bad.append(f"{torch_name} missing")
    elif int(np.prod(arrays[torch_name].shape)) != int(np.prod(want)):
      bad.append(f"{torch_name} {list(arrays[torch_name].shape)} (want {list(want)})")
    else:
      out[flax_path] = _as_flax(arrays[torch_name], want)
  if bad:
    more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
    raise UserError(f"backbone weights '{path}' do not fit the model: {', '.join(bad[:3])}"
                    f"{more}; give torchvision's ResNet-34 (resnet34-333f7ec4.pth) as .npz")
  return out


def convert(pth: str, npz: str) -> None:
  """torchvision .pth -> .npz of its tensors; needs torch (only here)."""
  import torch

  state = torch.load(pth, map_location="cpu", weights_only=True)
  np.savez(npz, **{k: v.numpy() for k, v in state.items() if v.dtype.is_floating_point})


def _main(argv: list[str]) -> Any:
  if len(argv) != 2:
    sys.exit("usage: python -m workloads.ssd.backbone IN.pth OUT.npz")
  convert(*argv)


if __name__ == "__main__":
  _main(sys.argv[1:])
