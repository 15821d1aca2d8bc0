"""Llama 3.1 8B pretraining (mlbench benchmark `llama31_8b`, MLPerf Training 6.0).

Full config: Llama 3.1 8B on the reference's C4 (Megatron `.bin`/`.idx`, Llama 3.1
tokenizer), sequences of 8,192 tokens, AdamW with a cosine schedule, trained to
validation log perplexity 3.3. Mini config: a small Llama on CPython's docstrings and
pydoc help texts with its own byte-level BPE, written in the same Megatron format.
The quality metric is held-out log perplexity (lower is better), logged as
`eval_accuracy`.
"""

from mlbench.workload import EvalSpec, InputSpec, Workload, lazy
from workloads.llama31_8b import config

_TRAIN = "workloads.llama31_8b.train"
_INPUT = "workloads.llama31_8b.input_pipeline"

WORKLOAD = Workload(
    name="llama31_8b",
    benchmark="llama31_8b",
    quality_metric="log_perplexity",
    configs={"mini": config.mini, "full": config.full},
    schedule=lazy(f"{_TRAIN}:schedule"),
    init=lazy(f"{_TRAIN}:init"),
    loss=lazy(f"{_TRAIN}:loss"),
    optimizer=lazy(f"{_TRAIN}:optimizer"),
    input=InputSpec(files=lazy(f"{_INPUT}:files"), examples=lazy(f"{_INPUT}:examples"),
                    prepare=lazy("workloads.llama31_8b.pydoc_corpus:prepare")),
    eval=EvalSpec(step=lazy(f"{_TRAIN}:eval_step"), compute=lazy(f"{_TRAIN}:compute")),
    synthetic_batch=lazy(f"{_INPUT}:synthetic_batch"),
    hparams=lazy(f"{_TRAIN}:hparams"),
    partition_rules=lazy(f"{_TRAIN}:partition_rules"),
    flops_per_example=lazy(f"{_TRAIN}:flops_per_example"),
    layer_stack=lazy(f"{_TRAIN}:layer_stack"),
)
