"""ResNet-50 v1.5 image classification (MLPerf benchmark `resnet`).

Full config: the MLPerf reference on ImageNet TFRecords (LARS, batch 4096).
Mini config: a narrow ResNet v1.5 on scikit-learn's handwritten digits, written
as ImageNet-schema TFRecords and read by the same pipeline code.
"""

from mlbench.workload import EvalSpec, InputSpec, Workload, lazy
from workloads.resnet50 import config

_TRAIN = "workloads.resnet50.train"
_INPUT = "workloads.resnet50.input_pipeline"

WORKLOAD = Workload(
    name="resnet50",
    benchmark="resnet",
    quality_metric="accuracy",
    configs={"mini": config.mini, "full": config.full},
    schedule=lazy(f"{_TRAIN}:schedule"),
    init=lazy(f"{_TRAIN}:init"),
    loss=lazy(f"{_TRAIN}:loss"),
    optimizer=lazy(f"{_TRAIN}:optimizer"),
    input=InputSpec(files=lazy(f"{_INPUT}:files"), decode=lazy(f"{_INPUT}:decode"),
                    prepare=lazy("workloads.resnet50.digits:prepare")),
    eval=EvalSpec(step=lazy(f"{_TRAIN}:eval_step"), compute=lazy(f"{_TRAIN}:compute")),
    synthetic_batch=lazy(f"{_INPUT}:synthetic_batch"),
    hparams=lazy(f"{_TRAIN}:hparams"),
    partition_rules=lazy(f"{_TRAIN}:partition_rules"),
    flops_per_example=lazy(f"{_TRAIN}:flops_per_example"),
    spatial_inputs=("image",),  # `--mesh data=N,spatial=M` splits every image by height
)
