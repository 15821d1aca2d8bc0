"""Every workload's quality metric, through the harness's whole eval path, against an
independent computation from the model's outputs.

Each test compiles the workload's eval step as `steps.compile_programs` does (its
`eval_fn`, the state's partition-rule shardings, batches split over the 8-device
mesh), feeds a small evaluation set in three batches through `evaluate.evaluate`
(the compiled eval step, the padding mask, the workload's host part, the merge
across batches and its final `compute`), and compares every reported metric with
the same metric computed here from the model's outputs, run unsharded on one
device: in NumPy, or with the reference library (pycocotools, sacreBLEU), to 1e-6
relative.

The sets are built to expose the usual metric bugs: the last batch is padded
with copies of real examples chosen so that counting them changes the answer;
the labels are set from the model's own predictions so that the metric is far
from 0 and 1; and where a metric has a per-token denominator the token counts
differ per example, so that averaging per example gives another number.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlbench import registry
from mlbench.train import data, evaluate, mesh as mesh_lib, sharding, steps
from mlbench.workload import Split, StepContext

BATCH = 16
"""Global eval batch: 2 examples per device on the 8-device mesh."""
REAL = 40
"""Real examples: two full batches and a last one of 8 real and 8 padded rows."""


@dataclasses.dataclass(frozen=True)
class Compiled:
  """A workload's mini config, its compiled eval step and an initial state on the mesh."""

  workload: object
  cfg: object
  eval: object
  batch_sharding: object
  state: steps.TrainState

  @property
  def params(self):
    """The parameters, fetched to the host: the independent computation runs them
    unsharded on one device, outside the harness."""
    return jax.device_get(self.state.params)

  @property
  def model_state(self):
    return jax.device_get(self.state.model_state)


def _compile(name: str, edit=lambda cfg: cfg) -> Compiled:
  """The mini config with BATCH-example eval batches; the init and eval programs
  compiled as `steps.compile_programs` compiles them (the train step, which
  evaluation never runs, is left out: it would double the compile time)."""
  w = registry.get(name)
  cfg = dataclasses.replace(edit(w.configs["mini"]()), eval_batch_size=BATCH)
  mesh = mesh_lib.make_mesh()
  init = steps.init_fn(w, cfg, w.optimizer(cfg, w.schedule(cfg)))
  rng_spec = jax.ShapeDtypeStruct((), jnp.uint32, sharding=mesh_lib.replicated(mesh))
  shapes = jax.eval_shape(init, rng_spec)
  state_sh = sharding.tree_shardings(shapes, w.partition_rules(cfg), mesh)
  batch_sh = mesh_lib.batch_sharding(mesh)
  spec = steps.batch_spec(w, cfg, Split.EVAL, BATCH, batch_sh)
  state_in = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                          shapes, state_sh)
  ev = jax.jit(steps.eval_fn(w, cfg, StepContext(mesh=mesh)), in_shardings=(state_sh, batch_sh),
               out_shardings=batch_sh).lower(state_in, spec).compile()
  state = jax.jit(init, out_shardings=state_sh)(mesh_lib.replicated_value(mesh, np.uint32(0)))
  return Compiled(w, cfg, ev, batch_sh, state)


def _with_params(c: Compiled, params) -> Compiled:
  """`c` with its state's parameters replaced, placed with the same shardings."""
  placed = jax.device_put(params, jax.tree.map(lambda x: x.sharding, c.state.params))
  return dataclasses.replace(c, state=dataclasses.replace(c.state, params=placed))


def _add_to_fc_bias(params, delta: np.ndarray):
  """`params` with `delta` added to the ResNet classifier's bias."""
  fc = dict(params["fc"])
  fc["bias"] = (np.asarray(fc["bias"]) + delta).astype(fc["bias"].dtype)
  return {**params, "fc": fc}


def _harness_eval(c: Compiled, real: dict[str, np.ndarray],
                  padding: dict[str, np.ndarray]) -> tuple[dict[str, float], int]:
  """The harness's evaluation of `real`, in batches of BATCH; the last batch is
  filled up with rows of `padding` (mask 0). Returns (metrics, examples counted)."""
  n = len(next(iter(real.values())))
  assert n % BATCH != 0, "the last batch must be padded"
  pairs = []
  for start in range(0, n, BATCH):
    m = min(BATCH, n - start)
    chunk = {k: np.concatenate([v[start:start + m], padding[k][:BATCH - m]]).astype(v.dtype)
             for k, v in real.items()}
    chunk[data.MASK] = (np.arange(BATCH) < m).astype(np.int32)
    pairs.append((chunk, mesh_lib.to_global(chunk, c.batch_sharding, BATCH)))
  metrics, part = evaluate.evaluate(c.workload, c.cfg, c.eval, c.state, pairs,
                                    expected=n)
  return metrics, part.count


def _assert_same(reported: dict[str, float], independent: dict[str, float]) -> None:
  assert set(reported) == set(independent)
  for k, v in independent.items():
    assert reported[k] == pytest.approx(v, rel=1e-6, abs=1e-12), k


def _log_softmax(logits: np.ndarray) -> np.ndarray:
  x = np.asarray(logits, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _hits_and_misses(pred: np.ndarray, num_classes: int, rng: np.random.Generator,
                     hit_rate: float) -> np.ndarray:
  """Labels that equal `pred` with probability `hit_rate`, and another class otherwise."""
  other = (pred + rng.integers(1, num_classes, pred.shape)) % num_classes
  return np.where(rng.random(pred.shape) < hit_rate, pred, other).astype(np.int32)


# --------------------------------------------------------------------------------- ResNet-50


def test_resnet50_top1_accuracy_and_loss_are_numpys_from_the_logits():
  from workloads.resnet50.model import ResNet

  c = _compile("resnet50")
  rng = np.random.default_rng(0)
  batch = c.workload.synthetic_batch(c.cfg, Split.EVAL, REAL + BATCH, rng)
  forward = jax.jit(lambda v, x: ResNet(c.cfg.model).apply(v, x, train=False))
  logits = np.asarray(forward({"params": c.params, **c.model_state}, batch["image"]))
  # A freshly initialised ResNet (the reference's init: fan-in he_normal, every BN
  # gamma 1) adds the same large component to every example's logits, so all answer
  # one class. Shift the classifier's bias by that mean: the answers then follow
  # each example's own features, and the accuracy can tell them apart.
  c = _with_params(c, _add_to_fc_bias(c.params, -logits.mean(0)))
  logits = np.asarray(forward({"params": c.params, **c.model_state}, batch["image"]))
  pred = logits.argmax(-1)
  assert len(np.unique(pred)) > 1  # the model does not answer one class for everything
  labels = _hits_and_misses(pred, c.cfg.model.num_classes, rng, 0.4)
  labels[REAL:] = pred[REAL:]  # every padded row a hit: counting them raises the accuracy
  real = {"image": batch["image"][:REAL], "label": labels[:REAL]}
  padding = {"image": batch["image"][REAL:], "label": labels[REAL:]}
  metrics, count = _harness_eval(c, real, padding)

  hits = pred[:REAL] == labels[:REAL]
  assert count == REAL and 0.2 < hits.mean() < 0.6
  nll = -_log_softmax(logits[:REAL])[np.arange(REAL), labels[:REAL]]
  _assert_same(metrics, {"accuracy": hits.mean(), "loss": nll.mean()})


# -------------------------------------------------------------------------------------- BERT


def test_bert_masked_lm_accuracy_is_over_all_masked_tokens_not_per_example():
  from workloads.bert.model import Bert

  c = _compile("bert")
  rng = np.random.default_rng(1)
  batch = c.workload.synthetic_batch(c.cfg, Split.EVAL, REAL + BATCH, rng)
  mlm, nsp = jax.jit(lambda b: Bert(c.cfg.model).apply({"params": c.params}, b,
                                                       deterministic=True))(batch)
  mlm, nsp = np.asarray(mlm), np.asarray(nsp)
  n, preds = batch["masked_lm_ids"].shape
  # 1 to all predictions real per example; the rest are the schema's padding (weight
  # 0), with ids the model gets right, so counting them would raise the accuracy.
  real_preds = rng.integers(1, preds + 1, n)
  weights = (np.arange(preds)[None] < real_preds[:, None]).astype(np.float32)
  pred = mlm.argmax(-1)
  ids = np.where(weights > 0, _hits_and_misses(pred, c.cfg.model.vocab_size, rng, 0.5), pred)
  nsp_labels = _hits_and_misses(nsp.argmax(-1), 2, rng, 0.5)
  ids[REAL:], nsp_labels[REAL:] = pred[REAL:], nsp.argmax(-1)[REAL:]  # padded rows: all hits
  batch = {**batch, "masked_lm_ids": ids.astype(np.int32), "masked_lm_weights": weights,
           "next_sentence_labels": nsp_labels}
  metrics, count = _harness_eval(c, {k: v[:REAL] for k, v in batch.items()},
                                 {k: v[REAL:] for k, v in batch.items()})

  w, hits = weights[:REAL], (pred == ids)[:REAL] * weights[:REAL]
  nll = -np.take_along_axis(_log_softmax(mlm[:REAL]), ids[:REAL, :, None], -1)[..., 0]
  accuracy = hits.sum() / w.sum()
  per_example = (hits.sum(1) / w.sum(1)).mean()
  assert count == REAL and abs(accuracy - per_example) > 1e-3
  _assert_same(metrics, {
      "accuracy": accuracy,
      "mlm_loss": (nll * w).sum() / w.sum(),
      "nsp_accuracy": (nsp.argmax(-1) == nsp_labels)[:REAL].mean()})


# --------------------------------------------------------------------------------------- MoE


def test_moe_log_perplexity_is_numpys_mean_nll_per_token():
  # The MoE data are fixed-length packed sequences (no padding tokens: the schema has
  # none), so every example predicts seq_length tokens; what can go wrong is the
  # token count, the reduction axis and padded sequences.
  from workloads.moe.input_pipeline import TOKENS
  from workloads.moe.model import MoeLM

  c = _compile("moe")
  batch = c.workload.synthetic_batch(c.cfg, Split.EVAL, REAL + BATCH, np.random.default_rng(2))
  tokens = batch[TOKENS]
  model = MoeLM(c.cfg.model, c.cfg.model.moe.eval_capacity_factor)
  logits, _ = jax.jit(lambda t: model.apply({"params": c.params}, t, deterministic=True))(
      tokens[:, :-1])
  nll = -np.take_along_axis(_log_softmax(logits), tokens[:, 1:, None], -1)[..., 0]
  # Padded rows: the sequences the model finds easiest, so counting them lowers the NLL.
  order = np.argsort(nll.sum(1))
  real, pad = order[BATCH:], order[:BATCH]
  metrics, count = _harness_eval(c, {TOKENS: tokens[real]}, {TOKENS: tokens[pad]})

  log_ppl = nll[real].sum() / nll[real].size
  assert count == REAL and nll.mean() < log_ppl - 1e-3
  _assert_same(metrics, {"log_perplexity": log_ppl, "perplexity": np.exp(log_ppl)})


# ------------------------------------------------------------------------------- Transformer


def _words(ids: np.ndarray) -> str:
  """A sentence of token ids up to EOS (1), padding (0) dropped; each id one word."""
  out = []
  for i in ids:
    if i == 1:
      break
    if i:
      out.append(str(i))
  return " ".join(out)


def test_transformer_bleu_is_sacrebleus_and_loss_is_per_target_token():
  import sacrebleu

  from workloads.transformer import train
  from workloads.transformer.model import Transformer

  c = _compile("transformer")  # no vocabulary file: every token id is a word
  rng = np.random.default_rng(3)
  batch = c.workload.synthetic_batch(c.cfg, Split.EVAL, REAL + BATCH, rng)
  hyps = np.asarray(jax.jit(lambda x: train.translate(c.cfg, c.params, x))(batch["inputs"]))
  # References: damaged copies of the model's translations (a word dropped, a word
  # replaced), so BLEU is neither 0 nor 1; the padded rows' references are their
  # translations exactly, so counting them raises BLEU.
  length = c.cfg.data.max_length
  targets = np.zeros((len(hyps), length), np.int32)
  for i, h in enumerate(hyps):
    words = [int(t) for t in _words(h).split()][:length - 1] or [3]
    if i < REAL and len(words) > 2 and rng.random() < 0.7:
      del words[rng.integers(len(words))]
    if i < REAL and rng.random() < 0.5:
      words[rng.integers(len(words))] = int(rng.integers(3, c.cfg.model.vocab_size))
    targets[i, :len(words) + 1] = [*words, 1]
  batch = {**batch, "targets": targets}
  # BLEU is scored on the translations the harness's sharded step produced (beam
  # search on another compilation may break a near tie otherwise), each looked up
  # by its source sentence, so padded or repeated rows still change the answer.
  translated = {}
  real_host = c.workload.eval.host

  def host(cfg, outputs, rows):
    translated.update({x.tobytes(): y for x, y in zip(rows["inputs"], outputs["translation"])})
    return real_host(cfg, outputs, rows)

  c = dataclasses.replace(c, workload=dataclasses.replace(
      c.workload, eval=dataclasses.replace(c.workload.eval, host=host)))
  metrics, count = _harness_eval(c, {k: v[:REAL] for k, v in batch.items()},
                                 {k: v[REAL:] for k, v in batch.items()})

  got = [_words(translated[x.tobytes()]) for x in batch["inputs"][:REAL]]
  assert sum(g == _words(h) for g, h in zip(got, hyps)) >= REAL - 2  # the same model
  refs = [_words(t) for t in targets[:REAL]]
  bleu = sacrebleu.corpus_bleu(got, [refs], lowercase=True).score / 100
  logits = jax.jit(lambda x, y: Transformer(c.cfg.model).apply({"params": c.params}, x, y))(
      batch["inputs"][:REAL], targets[:REAL])
  nll = -np.take_along_axis(_log_softmax(logits), targets[:REAL, :, None], -1)[..., 0]
  w = targets[:REAL] > 0
  per_example = ((nll * w).sum(1) / w.sum(1)).mean()
  assert count == REAL and 0.1 < bleu < 0.9
  assert abs(per_example - (nll * w).sum() / w.sum()) > 1e-4
  _assert_same(metrics, {"bleu": bleu, "loss": (nll * w).sum() / w.sum()})


# --------------------------------------------------------------------------------------- SSD


def _ssd_ground_truth(boxes, classes, rng, max_boxes, exact):
  """Ground truth made from an image's detections: its 1-3 best, moved a little
  (exactly, if `exact`), and on some images a box nothing detects (a miss)."""
  n = 3 if exact else int(rng.integers(1, 4))
  gt_boxes = np.zeros((max_boxes, 4), np.float32)
  gt_classes = np.zeros(max_boxes, np.int32)
  gt_boxes[:n] = np.clip(boxes[:n] + (0 if exact else rng.normal(0, 0.02, (n, 4))), 0, 1)
  gt_classes[:n] = classes[:n]
  if not exact and rng.random() < 0.5:
    lt = rng.uniform(0, 0.5, 2)
    gt_boxes[n] = [*lt, *(lt + 0.4)]
    gt_classes[n] = classes[0] % (max_boxes - 1) + 1
  return gt_boxes, gt_classes


def _coco_the_usual_way(tmp_path, rows, num_classes):
  """pycocotools as its users call it: an annotation file, a result list, in pixels."""
  from pycocotools.coco import COCO
  from pycocotools.cocoeval import COCOeval

  images, anns, results = [], [], []
  for i, (image_id, (h, w)) in enumerate(zip(rows["image_id"], rows["image_hw"])):
    images.append({"id": int(image_id), "height": int(h), "width": int(w)})
    scale = np.array([w, h, w, h], np.float64)
    for box, cls in zip(rows["gt_boxes"][i] * scale, rows["gt_classes"][i]):
      if cls:
        x, y, bw, bh = box[0], box[1], box[2] - box[0], box[3] - box[1]
        anns.append({"id": len(anns) + 1, "image_id": int(image_id), "category_id": int(cls),
                     "bbox": [x, y, bw, bh], "area": bw * bh, "iscrowd": 0})
    for box, score, cls in zip(rows["det_boxes"][i] * scale, rows["det_scores"][i],
                               rows["det_classes"][i]):
      if score > 0:
        results.append({"image_id": int(image_id), "category_id": int(cls), "score": float(score),
                        "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]]})
  path = tmp_path / "instances.json"
  path.write_text(json.dumps({"images": images, "annotations": anns,
                              "categories": [{"id": k} for k in range(1, num_classes)]}))
  gt = COCO(str(path))
  e = COCOeval(gt, gt.loadRes(results), iouType="bbox")
  e.evaluate()
  e.accumulate()
  e.summarize()
  # COCOeval's -1 (no ground truth in a size range) is reported as 0.
  names = ("mAP", "AP50", "AP75", "AP_small", "AP_medium", "AP_large")
  return {k: max(float(v), 0.0) for k, v in zip(names, e.stats)}


def test_ssd_coco_map_is_pycocotools_on_the_detections(tmp_path):
  from workloads.ssd import nms, train

  # 10 detections per image, not 50: an untrained model fills every slot, and
  # pycocotools' time grows with the detections.
  c = _compile("ssd", lambda cfg: dataclasses.replace(
      cfg, eval=dataclasses.replace(cfg.eval, max_detections=10)))
  cfg = c.cfg
  rng = np.random.default_rng(4)
  n = REAL + BATCH
  batch = c.workload.synthetic_batch(cfg, Split.EVAL, n, rng)
  variables = {"params": c.params, **c.model_state}
  anchors = train.anchors(cfg.anchors, cfg.data.image_size)

  @jax.jit
  def detect(images):
    loc, logits = train._model(cfg).apply(variables, images, train=False)
    return nms.detect(loc, logits, anchors, cfg.anchors, cfg.eval)

  det = jax.device_get(detect(batch["image"]))
  assert (det["scores"] > 0).sum(1).min() >= 3
  max_boxes = cfg.data.max_boxes
  gt = [_ssd_ground_truth(det["boxes"][i], det["classes"][i], rng, max_boxes, i >= REAL)
        for i in range(n)]
  hw = np.stack([rng.integers(200, 641, n), rng.integers(200, 641, n)], 1).astype(np.float32)
  boxes = np.stack([g[0] for g in gt])
  wh = (boxes[..., 2:] - boxes[..., :2]) * hw[:, None, ::-1]
  batch = {**batch, "boxes": boxes, "classes": np.stack([g[1] for g in gt]),
           "area": (wh[..., 0] * wh[..., 1]).astype(np.float32),
           "image_id": rng.permutation(np.arange(1, 10 * n))[:n].astype(np.int32),
           "image_hw": hw}
  metrics, count = _harness_eval(c, {k: v[:REAL] for k, v in batch.items()},
                                 {k: v[REAL:] for k, v in batch.items()})

  rows = {**{f"gt_{k}": batch[k][:REAL] for k in ("boxes", "classes")},
          **{f"det_{k}": v[:REAL] for k, v in det.items()},
          "image_id": batch["image_id"][:REAL], "image_hw": hw[:REAL]}
  expected = _coco_the_usual_way(tmp_path, rows, cfg.model.num_classes)
  assert count == REAL and 0.05 < expected["mAP"] < 0.8
  _assert_same(metrics, expected)


# ---------------------------------------------------------------------------------- Llama 3.1


def test_llama_log_perplexity_is_numpys_mean_nll_per_token():
  # Llama's samples are fixed-length windows of seq_length + 1 tokens over concatenated
  # documents, scored on every position (the reference's eod_mask_loss is off, so there
  # is no loss mask): every example predicts seq_length tokens and no per-example token
  # count can differ. What can go wrong is the token count, the reduction axis and
  # padded sequences.
  from workloads.llama31_8b.input_pipeline import TOKENS
  from workloads.llama31_8b.model import Llama

  c = _compile("llama31_8b")
  batch = c.workload.synthetic_batch(c.cfg, Split.EVAL, REAL + BATCH, np.random.default_rng(5))
  tokens = batch[TOKENS]
  logits = jax.jit(lambda t: Llama(c.cfg.model).apply({"params": c.params}, t))(tokens[:, :-1])
  nll = -np.take_along_axis(_log_softmax(logits), tokens[:, 1:, None], -1)[..., 0]
  # Padded rows: the sequences the model finds easiest, so counting them lowers the NLL.
  order = np.argsort(nll.sum(1))
  real, pad = order[BATCH:], order[:BATCH]
  metrics, count = _harness_eval(c, {TOKENS: tokens[real]}, {TOKENS: tokens[pad]})

  log_ppl = nll[real].sum() / nll[real].size
  assert nll.shape[1] == c.cfg.data.seq_length
  assert count == REAL and nll.mean() < log_ppl - 1e-4
  _assert_same(metrics, {"log_perplexity": log_ppl, "perplexity": np.exp(log_ppl)})
