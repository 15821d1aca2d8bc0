"""Transformer configs: `full` (Transformer-big on WMT en-de, for a pod) and `mini`
(CLDR en-de, CPU).

Run either with `mlbench run transformer --config full|mini`; edit any field with
`--set decode.beam_size=1`. This module imports nothing heavy.
"""

from __future__ import annotations

import dataclasses
import enum

from mlbench.fields import (AttentionImpl, DType, EpochConfig, Remat, at_least, divides, fraction, positive,
                            remat_choices, require)

MAX_POSITIONS = 1024
"""Rows of the sinusoidal position table; sequences are at most this long."""


class Source(enum.Enum):
  """Where the translation TFRecords come from."""

  WMT = "wmt"    # The MLPerf WMT17 en-de TFRecords and vocab.ende.32768 (supplied by you).
  CLDR = "cldr"  # Unicode CLDR en-de renderings from babel, written by mlbench.


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """An encoder-decoder Transformer with pre-LayerNorm blocks and one embedding
  shared by the source, the target and the output projection.

  The defaults are Transformer-big ("Attention Is All You Need", table 3) on the
  MLPerf WMT vocabulary (33,708 subwords).
  """

  vocab_size: int = 33708
  width: int = 1024
  mlp_width: int = 4096
  num_heads: int = 16
  encoder_layers: int = 6
  decoder_layers: int = 6
  dropout: float = 0.1            # residual, embedding and attention-probability dropout
  dtype: DType = DType.FLOAT32    # activations and matmuls; parameters stay float32
  # Which implementation computes attention (mlbench.train.attention): auto picks the fused
  # kernel the platform has where it can serve the shape (cuDNN on GPUs, Pallas on TPUs).
  attention: AttentionImpl = AttentionImpl.AUTO
  remat: Remat = Remat.NONE

  def __post_init__(self):
    at_least(self, 4, "vocab_size")  # padding, EOS and the unknown token come first
    at_least(self, 1, "width", "mlp_width", "encoder_layers", "decoder_layers")
    divides(self, "num_heads", "width")
    fraction(self, "dropout")
    remat_choices(self, Remat.NONE, Remat.FULL)


def _length(node, name: str) -> None:
  value = getattr(node, name)
  require(1 <= value <= MAX_POSITIONS, name, f"{value} is not in 1..{MAX_POSITIONS}, the "
          "positions the model has")


PACKED_RECORDS = 566_340
"""Records of Google's packed WMT training set (mlperf_input_pipeline.py L23; its v0.7
JAX submission logs this as train_samples)."""


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """The MLPerf WMT TFRecord schema (`inputs`, `targets`: token ids ending in EOS).

  Packed training records (Google's translate_ende_wmt32k_packed, 566,340 records of
  256 tokens: training_results_v0.7 Google transformer mlperf_input_pipeline.py
  L22-25) also carry `{inputs,targets}_segmentation` and `_position`: several
  sentence pairs per record, attention kept within each. Unpacked records hold
  one pair each; their epoch is their record count, which you give as
  `data.train_examples` (`--set data.packed=false --set data.train_examples=N`).
  The evaluation set is newstest2014's 3,003 sentences, as the reference scores BLEU on
  them: the raw newstest2014.en/.de beside the records, which `prepare` encodes into
  evaluation records; BLEU is scored against the raw sentences of `bleu_reference`
  (`newstest.py`).
  """

  source: Source = Source.WMT
  max_length: int = 256           # logged as max_sequence_length (see `length_method`)
  packed: bool = True             # training records carry segmentation and positions
  train_examples: int = 0         # records in an epoch; 0: PACKED_RECORDS if packed
  eval_examples: int = 3003       # newstest2014
  vocab_file: str = ""            # filled in from --data-dir by the harness when empty
  bleu_reference: str = ""        # WMT: newstest2014.de, filled in from --data-dir when empty

  def __post_init__(self):
    _length(self, "max_length")
    at_least(self, 1, "eval_examples")
    require(self.packed or self.train_examples > 0, "train_examples",
            f"{self.train_examples}: unpacked training records need their record count (an "
            "epoch); set data.train_examples=N")

  @property
  def length_method(self) -> str:
    """How examples over `max_length` are handled: training pairs with a longer side are
    left out (`input_pipeline.keep`, as the references); the CLDR generator never writes
    them."""
    return "discard"


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """Adam with linear warmup and inverse-square-root decay:
  lr = base * min(1, step / warmup) * rsqrt(max(step, warmup)) * rsqrt(width)."""

  base_learning_rate: float = 2.0
  warmup_steps: int = 1000
  beta_1: float = 0.9
  beta_2: float = 0.98
  epsilon: float = 1e-9
  label_smoothing: float = 0.1

  def __post_init__(self):
    at_least(self, 1, "warmup_steps")
    fraction(self, "beta_1", "beta_2", "label_smoothing")
    positive(self, "epsilon")


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
  """Beam search for evaluation (beam 1 is greedy decoding)."""

  beam_size: int = 4
  length_penalty: float = 0.6     # GNMT's alpha: score / ((5 + length) / 6) ** alpha
  max_length: int = 256           # output tokens, EOS included

  def __post_init__(self):
    at_least(self, 1, "beam_size")
    at_least(self, 0, "length_penalty")
    _length(self, "max_length")


@dataclasses.dataclass(frozen=True)
class TransformerConfig(EpochConfig[ModelConfig, DataConfig, OptimizerConfig]):
  decode: DecodeConfig = DecodeConfig()


def full() -> TransformerConfig:
  """Transformer-big at batch 2048 sequences of up to 256 tokens, Google's MLPerf v0.7
  JAX submission on TPU-v3 pods, with its Adam for that batch (training_results_v0.7
  transformer-research-JAX-tpu-v3-8192 train.py L761-766: learning rate 3.3092, 664
  warmup steps, beta 0.9087/0.9199, epsilon 1e-9), label smoothing 0.1, beam 4 with
  length penalty 0.6, target 25.0 uncased BLEU on newstest2014. Matmuls and activations
  in bfloat16 (parameters, optimizer state and the loss in float32), as MLPerf
  submissions train; `--precision float32` (or `--set model.dtype=float32`) for full
  precision.
  """
  return TransformerConfig(
      model=ModelConfig(dtype=DType.BFLOAT16),
      data=DataConfig(),
      optimizer=OptimizerConfig(base_learning_rate=3.3092157691415953, warmup_steps=664,
                                beta_1=0.9086575725261137, beta_2=0.9198719118104947),
      global_batch_size=2048,
      eval_batch_size=512,
      train_epochs=20.0,
  )


def mini() -> TransformerConfig:
  """A 2+2-layer, 128-wide Transformer on CLDR English-German renderings (12,000
  training pairs, 500 held out) with a 1,000-token BPE vocabulary, written as
  MLPerf-schema TFRecords and read by the same pipeline.
  """
  return TransformerConfig(
      model=ModelConfig(vocab_size=1000, width=128, mlp_width=512, num_heads=4,
                        encoder_layers=2, decoder_layers=2, dropout=0.0),
      data=DataConfig(source=Source.CLDR, max_length=24, packed=False, train_examples=12_000,
                      eval_examples=500),
      optimizer=OptimizerConfig(base_learning_rate=2.0, warmup_steps=200),
      decode=DecodeConfig(beam_size=4, max_length=24),
      global_batch_size=64,
      eval_batch_size=128,
      train_epochs=20.0,
  )
