"""The plain Vision Transformer on ImageNet (mlbench benchmark `vit`).

Full config: ViT-S/16 (B/16 by --set) as Beyer, Zhai, Kolesnikov, "Better plain ViT
baselines for ImageNet-1k" (2022) train it, with big_vision's configs/vit_s16_i1k.py as
the reference (rules/mlbench/vit.yaml, an unofficial ruleset: MLPerf never had the
benchmark). Mini config: a 4-layer ViT on the scikit-learn digits that resnet50's mini
config writes as ImageNet TFRecords.
"""

from mlbench.workload import EvalSpec, InputSpec, Workload, lazy
from workloads.vit import config

_TRAIN = "workloads.vit.train"
_INPUT = "workloads.vit.input_pipeline"

WORKLOAD = Workload(
    name="vit",
    benchmark="vit",
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
    partition_rules=lazy(f"{_TRAIN}:partition_rules"),
    flops_per_example=lazy(f"{_TRAIN}:flops_per_example"),
)
