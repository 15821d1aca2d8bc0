"""Transformer-big translation, English to German (MLPerf benchmark `transformer`).

Full config: Transformer-big with Adam on the MLPerf WMT en-de TFRecords, beam
search and uncased BLEU (target 25.0). Mini config: a 2+2-layer Transformer on
English-German renderings from the Unicode CLDR (babel), written as
MLPerf-schema TFRecords with its own BPE vocabulary and read by the same
pipeline code.
"""

from mlbench.workload import EvalSpec, InputSpec, Workload, lazy
from workloads.transformer import config

_TRAIN = "workloads.transformer.train"
_INPUT = "workloads.transformer.input_pipeline"

WORKLOAD = Workload(
    name="transformer",
    benchmark="transformer",
    quality_metric="bleu",
    configs={"mini": config.mini, "full": config.full},
    schedule=lazy(f"{_TRAIN}:schedule"),
    init=lazy(f"{_TRAIN}:init"),
    loss=lazy(f"{_TRAIN}:loss"),
    optimizer=lazy(f"{_TRAIN}:optimizer"),
    input=InputSpec(files=lazy(f"{_INPUT}:files"), decode=lazy(f"{_INPUT}:decode"),
                    prepare=lazy(f"{_INPUT}:prepare"),
                    bind=lazy(f"{_INPUT}:bind"), keep=lazy(f"{_INPUT}:keep")),
    eval=EvalSpec(step=lazy(f"{_TRAIN}:eval_step"), compute=lazy(f"{_TRAIN}:compute"),
                  host=lazy(f"{_TRAIN}:host")),
    synthetic_batch=lazy(f"{_INPUT}:synthetic_batch"),
    hparams=lazy(f"{_TRAIN}:hparams"),
    partition_rules=lazy(f"{_TRAIN}:partition_rules"),
    flops_per_example=lazy(f"{_TRAIN}:flops_per_example"),
)
