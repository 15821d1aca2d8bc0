"""The plain Vision Transformer on ImageNet (mlbench benchmark `vit`).

Full config: ViT-S/16 (B/16 by --set) as Beyer, Zhai, Kolesnikov, "Better plain ViT
baselines for ImageNet-1k" (2022) train it, with big_vision's configs/vit_s16_i1k.py as
the reference (rules/mlbench/vit.yaml, an unofficial ruleset: MLPerf never had the
benchmark). Mini config: a 4-layer ViT on the scikit-learn digits written as ImageNet
TFRecords (workloads.common.digits).
"""

from mlbench.convention import from_package

WORKLOAD = from_package(
    __name__, benchmark="vit", quality_metric="accuracy",
    elsewhere={"files": "workloads.common.imagenet", "prepare": "workloads.common.digits",
               "compute": "workloads.common.classify"},
)
