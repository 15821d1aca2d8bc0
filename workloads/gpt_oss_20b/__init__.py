"""GPT-OSS 20B pretraining (mlbench benchmark `gpt_oss_20b`, MLPerf Training 6.0 and 6.1).

Full config: GPT-OSS 20B (24 layers, a dropless top-4-of-32 Mixture of Experts in every
layer, attention alternating a sliding window of 128 with full causal) on the reference's
C4 (Megatron `.bin`/`.idx`, Llama 3.1 tokenizer: llama31_8b's files), sequences of 8,192
tokens, AdamW with a cosine schedule, trained to validation log perplexity 3.34. Mini
config: a small GPT-OSS on CPython's docstrings and pydoc help texts in the same format.
The quality metric is held-out log perplexity (lower is better), logged as
`eval_accuracy`.
"""

from mlbench.convention import from_package

WORKLOAD = from_package(
    __name__, benchmark="gpt_oss_20b", quality_metric="log_perplexity",
    also=("examples", "layer_stack", "prepare", "verify"),
    without=("decode",),  # Megatron .bin/.idx files, read as `examples`
)
