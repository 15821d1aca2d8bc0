"""ResNet-50 v1.5 image classification (MLPerf benchmark `resnet`).

Full config: the MLPerf reference on ImageNet TFRecords (LARS, batch 4096).
Mini config: a narrow ResNet v1.5 on scikit-learn's handwritten digits, written
as ImageNet-schema TFRecords and read by the same pipeline code.
"""

from mlbench.convention import from_package

WORKLOAD = from_package(
    __name__, benchmark="resnet", quality_metric="accuracy",
    elsewhere={"files": "workloads.common.imagenet", "prepare": "workloads.common.digits",
               "compute": "workloads.common.classify"},
    spatial_inputs=("image",),  # `--mesh data=N,spatial=M` splits every image by height
)
