"""BERT-large masked-LM pretraining (MLPerf benchmark `bert`).

Full config: BERT-large with LAMB on the MLPerf Wikipedia TFRecords (batch 8192).
Mini config: a 2-layer BERT on CPython's `pydoc_data.topics`, written as
MLPerf-schema TFRecords with its own WordPiece vocabulary and read by the same
pipeline code.
"""

from mlbench.convention import from_package
from mlbench.workload import StartPoint

WORKLOAD = from_package(
    __name__, benchmark="bert", quality_metric="accuracy",
    elsewhere={"prepare": "pydoc"}, also=("layer_stack", "pack"),
    # Phase 2 starts from the phase-1 checkpoint (mlcommons/training aa344c7f
    # retired_benchmarks/bert/README.md L5-9 and L193 `--init_checkpoint`).
    start=StartPoint(
        key="init_checkpoint", name="the phase-1 checkpoint model.ckpt-28252",
        source="the tf1_ckpt folder of the MLPerf BERT input files, downloaded as "
               "mlcommons/training retired_benchmarks/bert/README.md says"),
)
