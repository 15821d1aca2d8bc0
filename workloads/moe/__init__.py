"""A GShard-style top-2 Mixture-of-Experts language model (mlbench benchmark `moe`).

Full config: a 24-layer decoder-only Transformer LM with 64 experts in every
other layer (13.2 B parameters), expert parallel over mesh axis `expert`.
Mini config: a 2-layer LM with 4 experts on CPython's `pydoc_data.topics`,
tokenised with its own byte-level BPE. The quality metric is held-out log
perplexity (lower is better); the rules (`rules/mini/moe.yaml`) are modelled
on the MLPerf Training 6.1 `gpt_oss_20b` rules.
"""

from mlbench.convention import from_package

WORKLOAD = from_package(
    __name__, benchmark="moe", quality_metric="log_perplexity",
    elsewhere={"prepare": "pydoc_lm"}, also=("layer_stack",),
)
