"""A GShard-style top-2 Mixture-of-Experts language model (mlbench benchmark `moe`).

Full config: a 24-layer decoder-only Transformer LM with 64 experts in every
other layer (13.2 B parameters), expert parallel over mesh axis `expert`.
Mini config: a 2-layer LM with 4 experts on CPython's `pydoc_data.topics`,
tokenised with its own byte-level BPE. The quality metric is held-out log
perplexity (lower is better); the rules (`rules/mini/moe.yaml`) are modelled
on the MLPerf Training 6.1 `gpt_oss_20b` rules.
"""

from mlbench.workload import EvalSpec, InputSpec, Workload, lazy
from workloads.moe import config

_TRAIN = "workloads.moe.train"
_INPUT = "workloads.moe.input_pipeline"

WORKLOAD = Workload(
    name="moe",
    benchmark="moe",
    quality_metric="log_perplexity",
    configs={"mini": config.mini, "full": config.full},
    schedule=lazy(f"{_TRAIN}:schedule"),
    init=lazy(f"{_TRAIN}:init"),
    loss=lazy(f"{_TRAIN}:loss"),
    optimizer=lazy(f"{_TRAIN}:optimizer"),
    input=InputSpec(files=lazy(f"{_INPUT}:files"), decode=lazy(f"{_INPUT}:decode"),
                    prepare=lazy("workloads.moe.pydoc_lm:prepare")),
    eval=EvalSpec(step=lazy(f"{_TRAIN}:eval_step"), compute=lazy(f"{_TRAIN}:compute")),
    synthetic_batch=lazy(f"{_INPUT}:synthetic_batch"),
    hparams=lazy(f"{_TRAIN}:hparams"),
    partition_rules=lazy(f"{_TRAIN}:partition_rules"),
    flops_per_example=lazy(f"{_TRAIN}:flops_per_example"),
    layer_stack=lazy(f"{_TRAIN}:layer_stack"),
)
