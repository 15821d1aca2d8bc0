"""EfficientNet B0-B7 image classification at large batch (mlbench benchmark `efficientnet`).

Full config: EfficientNet-B5 on ImageNet TFRecords at global batch 65,536 with LARS, as
Wongpanich et al. 2020 train it on TPU-v3 pods (rules/mlbench/efficientnet.yaml, an
unofficial ruleset: MLPerf never had the benchmark). Mini config: a narrow B0 on the
scikit-learn digits written as ImageNet TFRecords (workloads.common.digits).
"""

from mlbench.convention import from_package

WORKLOAD = from_package(
    __name__, benchmark="efficientnet", quality_metric="accuracy",
    elsewhere={"files": "workloads.common.imagenet", "prepare": "workloads.common.digits",
               "compute": "workloads.common.classify"},
    without=("partition_rules",),
    spatial_inputs=("image",),  # `--mesh data=N,spatial=M` splits every image by height
)
