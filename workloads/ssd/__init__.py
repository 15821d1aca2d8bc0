"""SSD single-shot detection with COCO mAP (MLPerf benchmark `ssd`).

Full config: SSD-ResNet-34 at 300x300 on COCO 2017 TFRecords, MLPerf training
0.7.0 (target mAP 0.23). Mini config: a small SSD on scenes of scikit-learn's
handwritten digits, written as COCO-schema TFRecords and read by the same
pipeline code. The eval step returns fixed-size per-image detections; every
host's rows are gathered and scored once with pycocotools.
"""

from mlbench.convention import from_package
from mlbench.workload import StartPoint

WORKLOAD = from_package(
    __name__, benchmark="ssd", quality_metric="mAP",
    elsewhere={"prepare": "scenes", "compute": "coco", "host": "coco"}, also=("keep",),
    spatial_inputs=("image",),  # `--mesh data=N,spatial=M` splits every image by height
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
