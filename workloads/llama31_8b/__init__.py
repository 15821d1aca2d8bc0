"""Llama 3.1 8B pretraining (mlbench benchmark `llama31_8b`, MLPerf Training 6.0).

Full config: Llama 3.1 8B on the reference's C4 (Megatron `.bin`/`.idx`, Llama 3.1
tokenizer), sequences of 8,192 tokens, AdamW with a cosine schedule, trained to
validation log perplexity 3.3. Mini config: a small Llama on CPython's docstrings and
pydoc help texts with its own byte-level BPE, written in the same Megatron format.
The quality metric is held-out log perplexity (lower is better), logged as
`eval_accuracy`.
"""

from mlbench.convention import from_package

WORKLOAD = from_package(
    __name__, benchmark="llama31_8b", quality_metric="log_perplexity",
    also=("examples", "layer_stack", "prepare", "verify"),
    without=("decode",),  # Megatron .bin/.idx files, read as `examples`
)
