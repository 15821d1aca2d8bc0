"""SSD single-shot detection with COCO mAP (MLPerf benchmark `ssd`).

Full config: SSD-ResNet-34 at 300x300 on COCO 2017 TFRecords, MLPerf training
0.7.0 (target mAP 0.23). Mini config: a small SSD on scenes of scikit-learn's
handwritten digits, written as COCO-schema TFRecords and read by the same
pipeline code. The eval step returns fixed-size per-image detections; every
host's rows are gathered and scored once with pycocotools.
"""

from mlbench.workload import EvalSpec, InputSpec, StartPoint, Workload, lazy
from workloads.ssd import config

_TRAIN = "workloads.ssd.train"
_INPUT = "workloads.ssd.input_pipeline"
_COCO = "workloads.ssd.coco"

WORKLOAD = Workload(
    name="ssd",
    benchmark="ssd",
    quality_metric="mAP",
    configs={"mini": config.mini, "full": config.full},
    schedule=lazy(f"{_TRAIN}:schedule"),
    init=lazy(f"{_TRAIN}:init"),
    loss=lazy(f"{_TRAIN}:loss"),
    optimizer=lazy(f"{_TRAIN}:optimizer"),
    input=InputSpec(files=lazy(f"{_INPUT}:files"), decode=lazy(f"{_INPUT}:decode"),
                    prepare=lazy("workloads.ssd.scenes:prepare"), keep=lazy(f"{_INPUT}:keep")),
    eval=EvalSpec(step=lazy(f"{_TRAIN}:eval_step"), compute=lazy(f"{_COCO}:compute"),
                  host=lazy(f"{_COCO}:host")),
    synthetic_batch=lazy(f"{_INPUT}:synthetic_batch"),
    hparams=lazy(f"{_TRAIN}:hparams"),
    partition_rules=lazy(f"{_TRAIN}:partition_rules"),
    flops_per_example=lazy(f"{_TRAIN}:flops_per_example"),
    # The `ssd` key is RetinaNet from MLPerf 1.1 on; this is the SSD-ResNet-34 of 0.7.0.
    rulesets=("0.7.0",),
    # The backbone starts from torchvision's ImageNet ResNet-34 (mlcommons/training aa344c7f
    # retired_benchmarks/ssd-v1/download_resnet34_backbone.sh L4, ssd/base_model.py L58-61).
    start=StartPoint(
        key="backbone_weights", name="the ImageNet ResNet-34 backbone",
        source="torchvision's resnet34-333f7ec4.pth, which the reference's "
               "download_resnet34_backbone.sh fetches, made into an .npz once with `python -m "
               "workloads.ssd.backbone resnet34-333f7ec4.pth resnet34.npz`"),
)
