"""EfficientNet B0-B7 image classification at large batch (mlbench benchmark `efficientnet`).

Full config: EfficientNet-B5 on ImageNet TFRecords at global batch 65,536 with LARS, as
Wongpanich et al. 2020 train it on TPU-v3 pods (rules/mlbench/efficientnet.yaml, an
unofficial ruleset: MLPerf never had the benchmark). Mini config: a narrow B0 on the
scikit-learn digits that resnet50's mini config writes as ImageNet TFRecords.
"""

from mlbench.workload import EvalSpec, InputSpec, Workload, lazy
from workloads.efficientnet import config

_TRAIN = "workloads.efficientnet.train"
_INPUT = "workloads.efficientnet.input_pipeline"

WORKLOAD = Workload(
    name="efficientnet",
    benchmark="efficientnet",
    quality_metric="accuracy",
    configs={"mini": config.mini, "full": config.full},
    schedule=lazy(f"{_TRAIN}:schedule"),
    init=lazy(f"{_TRAIN}:init"),
    loss=lazy(f"{_TRAIN}:loss"),
    optimizer=lazy(f"{_TRAIN}:optimizer"),
    input=InputSpec(files=lazy(f"{_INPUT}:files"), decode=lazy(f"{_INPUT}:decode"),
                    prepare=lazy(f"{_INPUT}:prepare")),
    eval=EvalSpec(step=lazy(f"{_TRAIN}:eval_step"), compute=lazy(f"{_TRAIN}:compute")),
    synthetic_batch=lazy(f"{_INPUT}:synthetic_batch"),
    hparams=lazy(f"{_TRAIN}:hparams"),
    flops_per_example=lazy(f"{_TRAIN}:flops_per_example"),
    spatial_inputs=("image",),  # `--mesh data=N,spatial=M` splits every image by height
)
