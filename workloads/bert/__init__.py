"""BERT-large masked-LM pretraining (MLPerf benchmark `bert`).

Full config: BERT-large with LAMB on the MLPerf Wikipedia TFRecords (batch 8192).
Mini config: a 2-layer BERT on CPython's `pydoc_data.topics`, written as
MLPerf-schema TFRecords with its own WordPiece vocabulary and read by the same
pipeline code.
"""

from mlbench.workload import EvalSpec, InputSpec, StartPoint, Workload, lazy
from workloads.bert import config

_TRAIN = "workloads.bert.train"
_INPUT = "workloads.bert.input_pipeline"

WORKLOAD = Workload(
    name="bert",
    benchmark="bert",
    quality_metric="accuracy",
    configs={"mini": config.mini, "full": config.full},
    schedule=lazy(f"{_TRAIN}:schedule"),
    init=lazy(f"{_TRAIN}:init"),
    loss=lazy(f"{_TRAIN}:loss"),
    optimizer=lazy(f"{_TRAIN}:optimizer"),
    input=InputSpec(files=lazy(f"{_INPUT}:files"), decode=lazy(f"{_INPUT}:decode"),
                    prepare=lazy("workloads.bert.pydoc:prepare")),
    eval=EvalSpec(step=lazy(f"{_TRAIN}:eval_step"), compute=lazy(f"{_TRAIN}:compute")),
    synthetic_batch=lazy(f"{_INPUT}:synthetic_batch"),
    hparams=lazy(f"{_TRAIN}:hparams"),
    partition_rules=lazy(f"{_TRAIN}:partition_rules"),
    flops_per_example=lazy(f"{_TRAIN}:flops_per_example"),
    # Phase 2 starts from the phase-1 checkpoint (mlcommons/training aa344c7f
    # retired_benchmarks/bert/README.md L5-9 and L193 `--init_checkpoint`).
    start=StartPoint(
        key="init_checkpoint", name="the phase-1 checkpoint model.ckpt-28252",
        source="the tf1_ckpt folder of the MLPerf BERT input files, downloaded as "
               "mlcommons/training retired_benchmarks/bert/README.md says"),
)
