"""BERT's phase-1 checkpoint: a TensorFlow checkpoint under the reference's variable
names loads into the flax model and computes what the reference computes.

The reference is mlcommons/training retired_benchmarks/bert (modeling.py,
run_pretraining.py); `_reference_mlm_logits` transcribes its forward pass in
NumPy, line by line, over the TensorFlow-side arrays.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import numpy as np
import pytest
import tensorflow as tf

from mlbench.errors import UserError
from mlbench.workload import Split, unpack
from workloads.bert import WORKLOAD, checkpoint, config
from workloads.bert.model import Bert


def _small() -> config.BertConfig:
  cfg = config.mini()
  return dataclasses.replace(cfg, model=dataclasses.replace(
      cfg.model, vocab_size=512, hidden_size=32, num_heads=4, intermediate_size=64))


def _tf_weights(cfg: config.BertConfig, seed: int = 0) -> dict[str, np.ndarray]:
  """Random weights under every reference name, at the reference's shapes (the
  names and shapes written out from modeling.py and run_pretraining.py)."""
  m, rng = cfg.model, np.random.default_rng(seed)
  h, f, out = m.hidden_size, m.intermediate_size, {}

  def put(name, *shape, scale=0.2):
    out[name] = (rng.standard_normal(shape) * scale).astype(np.float32)

  put("bert/embeddings/word_embeddings", m.vocab_size, h)               # modeling.py L411
  put("bert/embeddings/token_type_embeddings", m.type_vocab_size, h)    # L478
  put("bert/embeddings/position_embeddings", m.max_position_embeddings, h)  # L494
  for layer in [f"bert/encoder/layer_{i}" for i in range(m.num_layers)] + ["bert/embeddings"]:
    for norm in (["attention/output/LayerNorm", "output/LayerNorm"]
                 if "encoder" in layer else ["LayerNorm"]):
      out[f"{layer}/{norm}/gamma"] = (1 + rng.standard_normal(h) * 0.1).astype(np.float32)
      put(f"{layer}/{norm}/beta", h, scale=0.1)
  for i in range(m.num_layers):
    base = f"bert/encoder/layer_{i}"
    for proj in ("query", "key", "value"):                               # L583-591
      put(f"{base}/attention/self/{proj}/kernel", h, h)
      put(f"{base}/attention/self/{proj}/bias", h)
    put(f"{base}/attention/output/dense/kernel", h, h)                   # L625-631
    put(f"{base}/attention/output/dense/bias", h)
    put(f"{base}/intermediate/dense/kernel", h, f)                        # L660-663
    put(f"{base}/intermediate/dense/bias", f)
    put(f"{base}/output/dense/kernel", f, h)
    put(f"{base}/output/dense/bias", h)
  put("bert/pooler/dense/kernel", h, h)
  put("bert/pooler/dense/bias", h)
  put("cls/predictions/transform/dense/kernel", h, h)                     # run_pretraining L284-290
  put("cls/predictions/transform/dense/bias", h)
  out["cls/predictions/transform/LayerNorm/gamma"] = np.ones(h, np.float32)
  put("cls/predictions/transform/LayerNorm/beta", h, scale=0.1)
  put("cls/predictions/output_bias", m.vocab_size)                        # L295
  put("cls/seq_relationship/output_weights", 2, h)                        # L327
  put("cls/seq_relationship/output_bias", 2)
  put("cls/predictions/output_bias/adam_m", m.vocab_size)  # optimizer slots are ignored
  return out


def _save(weights: dict[str, np.ndarray], prefix) -> str:
  """Writes a TF checkpoint (index + data file) with exactly these variable names."""
  names = sorted(weights)
  tf.raw_ops.SaveV2(prefix=str(prefix), tensor_names=names, shape_and_slices=[""] * len(names),
                    tensors=[tf.constant(weights[n]) for n in names])
  return str(prefix)


def _gelu(x):
  # modeling.py L274-276.
  return x * 0.5 * (1.0 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _layer_norm(x, w, name):
  # modeling.py L361-367: LayerNormalization(axis=-1, epsilon=1e-12).
  mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + 1e-12) * w[f"{name}/gamma"] + w[f"{name}/beta"]


def _attention(x, mask, w, base, heads):
  """modeling.py attention_layer: 3-D dense q/k/v, scores / sqrt(D), the -10000 adder
  on masked keys, softmax, context; then the output dense (dense_layer_3d_proj)."""
  b, length, h = x.shape
  d = h // heads

  def proj(name):
    return (x @ w[f"{base}/attention/self/{name}/kernel"]
            + w[f"{base}/attention/self/{name}/bias"]).reshape(b, length, heads, d)

  scores = np.einsum("bfnh,btnh->bnft", proj("query"), proj("key")) / np.sqrt(d)
  scores = scores + (1.0 - mask[:, None, None, :]) * -10000.0
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  context = np.einsum("bnft,btnh->bfnh", probs, proj("value")).reshape(b, length, h)
  return (context @ w[f"{base}/attention/output/dense/kernel"]
          + w[f"{base}/attention/output/dense/bias"])


def _reference_mlm_logits(w, batch, cfg):
  """BertModel (modeling.py L158-215, L860-925) and get_masked_lm_output
  (run_pretraining.py L275-300), in float64."""
  w = {k: v.astype(np.float64) for k, v in w.items()}
  ids, length = batch["input_ids"], batch["input_ids"].shape[1]
  x = (w["bert/embeddings/word_embeddings"][ids]
       + w["bert/embeddings/token_type_embeddings"][batch["segment_ids"]]
       + w["bert/embeddings/position_embeddings"][:length][None])
  x = _layer_norm(x, w, "bert/embeddings/LayerNorm")
  mask = batch["input_mask"].astype(np.float64)
  for i in range(cfg.model.num_layers):
    base = f"bert/encoder/layer_{i}"
    x = _layer_norm(_attention(x, mask, w, base, cfg.model.num_heads) + x, w,
                    f"{base}/attention/output/LayerNorm")
    inner = _gelu(x @ w[f"{base}/intermediate/dense/kernel"] + w[f"{base}/intermediate/dense/bias"])
    x = _layer_norm(inner @ w[f"{base}/output/dense/kernel"] + w[f"{base}/output/dense/bias"]
                    + x, w, f"{base}/output/LayerNorm")
  x = np.take_along_axis(x, batch["masked_lm_positions"][..., None], axis=1)
  x = _gelu(x @ w["cls/predictions/transform/dense/kernel"]
            + w["cls/predictions/transform/dense/bias"])
  x = _layer_norm(x, w, "cls/predictions/transform/LayerNorm")
  return x @ w["bert/embeddings/word_embeddings"].T + w["cls/predictions/output_bias"]


@pytest.mark.parametrize("scan", [False, True], ids=["layers", "scanned-layers"])
def test_the_phase1_checkpoint_gives_the_reference_mlm_logits(tmp_path, scan):
  cfg = _small()
  weights = _tf_weights(cfg)
  # Scanned layers (a pipeline's layer stack) load layer i's variables at index i.
  cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, scan_layers=scan))
  cfg = dataclasses.replace(cfg, init_checkpoint=_save(weights, tmp_path / "model.ckpt-28252"))
  params, _ = jax.jit(WORKLOAD.init, static_argnums=0)(cfg, jax.random.key(1))
  batch = WORKLOAD.synthetic_batch(cfg, Split.EVAL, 3, np.random.default_rng(2))
  batch["input_mask"][:, -5:] = 0  # padded keys are masked out as in the reference
  mlm, _ = Bert(cfg.model).apply({"params": params}, batch)
  want = _reference_mlm_logits(weights, batch, cfg)
  np.testing.assert_allclose(np.asarray(mlm), want, rtol=2e-4, atol=2e-4)
  assert np.abs(want).max() > 1.0  # the logits are far from a trivial all-zero output
  np.testing.assert_array_equal(params["next_sentence"]["kernel"],
                                weights["cls/seq_relationship/output_weights"].T)
  hp = WORKLOAD.hparams(cfg, WORKLOAD.schedule(cfg), None)
  value, meta = unpack(hp["weights_initialization"])
  assert value == cfg.init_checkpoint
  assert meta["variables"] == (len(checkpoint.reference_names(cfg.model)) if scan
                               else len(params_leaves(params)))


def params_leaves(params):
  return jax.tree_util.tree_leaves(params)


@pytest.mark.parametrize("damage, named", [
    ("drop", "bert/encoder/layer_1/attention/self/key/kernel"),
    ("reshape", "bert/encoder/layer_0/intermediate/dense/kernel [32, 63] (want [32, 64])"),
])
def test_a_checkpoint_that_does_not_fit_names_the_variable(tmp_path, damage, named):
  cfg = _small()
  weights = _tf_weights(cfg)
  if damage == "drop":
    del weights[named]
  else:
    name = named.split()[0]
    weights[name] = weights[name][:, :-1]
  cfg = dataclasses.replace(cfg, init_checkpoint=_save(weights, tmp_path / "ckpt"))
  with pytest.raises(UserError, match=re.escape(named)):
    WORKLOAD.init(cfg, jax.random.key(0))


def test_a_missing_checkpoint_is_a_user_error(tmp_path):
  cfg = dataclasses.replace(_small(), init_checkpoint=str(tmp_path / "nothing"))
  with pytest.raises(UserError, match="cannot read the BERT init checkpoint"):
    WORKLOAD.init(cfg, jax.random.key(0))


def test_every_model_parameter_has_a_reference_name():
  cfg = config.full()
  shapes = jax.eval_shape(lambda: WORKLOAD.init(cfg, jax.random.key(0)))[0]
  flat = {"/".join(k.key for k in p): x.shape
          for p, x in jax.tree_util.tree_flatten_with_path(shapes)[0]}
  names = checkpoint.reference_names(cfg.model)
  assert set(flat) == set(names)
  assert all(int(np.prod(flat[k])) == int(np.prod(v.shape)) for k, v in names.items())
  # 24 layers x 16 variables + 5 embedding + 2 pooler + 5 masked-LM + 2 next-sentence.
  assert len(names) == 24 * 16 + 14
