"""Transformer-big translation, English to German (MLPerf benchmark `transformer`).

Full config: Transformer-big with Adam on the MLPerf WMT en-de TFRecords, beam
search and uncased BLEU (target 25.0). Mini config: a 2+2-layer Transformer on
English-German renderings from the Unicode CLDR (babel), written as
MLPerf-schema TFRecords with its own BPE vocabulary and read by the same
pipeline code.
"""

from mlbench.convention import from_package

WORKLOAD = from_package(
    __name__, benchmark="transformer", quality_metric="bleu",
    also=("prepare", "bind", "keep", "host", "verify"),
)
