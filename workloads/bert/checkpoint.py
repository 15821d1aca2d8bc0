"""The MLPerf phase-1 checkpoint: BERT weights from a TensorFlow checkpoint.

MLPerf BERT starts phase 2 from the phase-1 checkpoint `model.ckpt-28252`
(mlcommons/training retired_benchmarks/bert/README.md L6-9, `--init_checkpoint`
at L193), a TensorFlow 1 checkpoint whose variables carry google-research/bert's
names (`bert/encoder/layer_0/attention/self/query/kernel`, ...;
modeling.py L158-215 and L880-925, run_pretraining.py L281-335). `REFERENCE_NAMES`
maps each of them onto this package's flax tree and `read` loads them through
`tf.train.load_checkpoint`, which reads the checkpoint's index and data files
without executing anything stored in them. The LAMB slots (`adam_m`, `adam_v`)
and `global_step` of the phase-1 run are not read: phase 2 starts its optimizer
afresh, as the reference does (run_pretraining.py L166-184 restores only the
trainable variables).
"""

from __future__ import annotations

import typing
from typing import Any

import numpy as np

from mlbench.errors import UserError
from workloads.bert.config import ModelConfig


class Var(typing.NamedTuple):
  """A reference variable: its name, its shape in the checkpoint, and whether the
  flax array is its transpose (otherwise a reshape: the flat [H, H] / [H] attention
  kernels and biases are [H, N, D] / [N, D] per head in flax, and the attention
  output kernel [N, D, H], as the reference reshapes them, modeling.py L587-592, L628)."""

  name: str
  shape: tuple[int, ...]
  transpose: bool = False


def _dense(flax: str, tf: str, n_in: int, n_out: int) -> dict[str, Var]:
  return {f"{flax}/kernel": Var(f"{tf}/kernel", (n_in, n_out)),
          f"{flax}/bias": Var(f"{tf}/bias", (n_out,))}


def _norm(flax: str, tf: str, width: int) -> dict[str, Var]:
  return {f"{flax}/scale": Var(f"{tf}/gamma", (width,)),
          f"{flax}/bias": Var(f"{tf}/beta", (width,))}


def _layer(cfg: ModelConfig, i: int) -> dict[str, Var]:
  flax, tf, h, f = f"layer_{i}", f"bert/encoder/layer_{i}", cfg.hidden_size, cfg.intermediate_size
  out: dict[str, Var] = {}
  for proj in ("query", "key", "value"):
    out |= _dense(f"{flax}/attention/{proj}", f"{tf}/attention/self/{proj}", h, h)
  out |= _dense(f"{flax}/attention/output", f"{tf}/attention/output/dense", h, h)
  out |= _norm(f"{flax}/attention_layer_norm", f"{tf}/attention/output/LayerNorm", h)
  out |= _dense(f"{flax}/mlp/intermediate", f"{tf}/intermediate/dense", h, f)
  out |= _dense(f"{flax}/mlp/output", f"{tf}/output/dense", f, h)
  out |= _norm(f"{flax}/output_layer_norm", f"{tf}/output/LayerNorm", h)
  return out


def reference_names(cfg: ModelConfig) -> dict[str, Var]:
  """flax parameter path -> the reference variable it is loaded from."""
  h, emb = cfg.hidden_size, "bert/embeddings"
  out = {"word_embeddings/embedding": Var(f"{emb}/word_embeddings", (cfg.vocab_size, h)),
         "position_embeddings/embedding": Var(f"{emb}/position_embeddings",
                                              (cfg.max_position_embeddings, h)),
         "token_type_embeddings/embedding": Var(f"{emb}/token_type_embeddings",
                                                (cfg.type_vocab_size, h))}
  out |= _norm("embeddings_layer_norm", f"{emb}/LayerNorm", h)
  for i in range(cfg.num_layers):
    out |= _layer(cfg, i)
  out |= _dense("pooler", "bert/pooler/dense", h, h)
  out |= _dense("mlm_transform", "cls/predictions/transform/dense", h, h)
  out |= _norm("mlm_layer_norm", "cls/predictions/transform/LayerNorm", h)
  out["mlm_output_bias"] = Var("cls/predictions/output_bias", (cfg.vocab_size,))
  # [2, H], applied as matmul(x, w, transpose_b=True) (run_pretraining.py L327-335).
  out["next_sentence/kernel"] = Var("cls/seq_relationship/output_weights", (2, h), True)
  out["next_sentence/bias"] = Var("cls/seq_relationship/output_bias", (2,))
  return out


def _reader(path: str) -> Any:
  import tensorflow as tf

  try:
    return tf.train.load_checkpoint(path)
  except (ValueError, tf.errors.OpError) as e:
    raise UserError(f"cannot read the BERT init checkpoint '{path}' ({str(e).splitlines()[0]}); "
                    "give the checkpoint prefix, e.g. /data/phase1/model.ckpt-28252") from None


def check(cfg: ModelConfig, path: str) -> dict[str, Var]:
  """The variables to load, after checking that the checkpoint has every one of
  them with the shape `cfg` needs; raises `UserError` naming the first few that
  are missing or mis-shaped."""
  names = reference_names(cfg)
  have = _reader(path).get_variable_to_shape_map()
  missing = [v.name for v in names.values() if v.name not in have]
  wrong = [f"{v.name} {list(have[v.name])} (want {list(v.shape)})" for v in names.values()
           if v.name in have and tuple(have[v.name]) != v.shape]
  for what, bad in (("missing", missing), ("of the wrong shape", wrong)):
    if bad:
      more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
      raise UserError(f"BERT init checkpoint '{path}': {len(bad)} variable(s) {what}: "
                      f"{', '.join(bad[:3])}{more}; give the MLPerf phase-1 checkpoint "
                      "(model.ckpt-28252) of a model with this config's sizes")
  return names


def read(cfg: ModelConfig, path: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
  """flax parameter path -> float32 array, for every path in `shapes` (flax path ->
  shape), read from the checkpoint at `path`."""
  names = check(cfg, path)
  reader = _reader(path)

  def value(var: Var, shape: tuple[int, ...]) -> np.ndarray:
    v = np.asarray(reader.get_tensor(var.name), np.float32)
    return (v.T if var.transpose else v).reshape(shape)

  out = {}
  for flax_path, shape in shapes.items():
    if flax_path.startswith(STACKED):  # scan_layers: layer i's variables at index i
      rest = flax_path[len(STACKED):]
      out[flax_path] = np.stack([value(names[f"layer_{i}/{rest}"], shape[1:])
                                 for i in range(shape[0])])
    else:
      out[flax_path] = value(names[flax_path], shape)
  return out


STACKED = "layers/layer/"
"""Where scanned layers (`ModelConfig.scan_layers`) keep their stacked parameters."""
