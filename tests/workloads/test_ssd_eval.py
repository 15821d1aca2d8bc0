"""SSD evaluation: COCO mAP against pycocotools, and distributed evaluation (the same
detections and mAP on 1, 2 and 8 devices and 2 hosts), with batch norm over groups.

Split from test_ssd.py, which keeps the model, boxes, loss, NMS and schedule.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlbench.train import data, evaluate, mesh as mesh_lib, sharding, steps
from mlbench.workload import EvalPart, Split, StepContext
from workloads.ssd import WORKLOAD, coco, config, input_pipeline, train

DATA = Path(__file__).parents[1] / "data" / "mlperf-results"


# ------------------------------------------------------------------------------- COCO mAP


def _rows(gt_boxes, gt_classes, det_boxes, det_scores, det_classes, size=100.0):
  """An evaluation's gathered rows (as coco.host makes them) for images of size x size."""
  gt = np.asarray(gt_boxes, np.float32)
  n = len(gt)
  return EvalPart(rows={
      "image_id": np.arange(1, n + 1, dtype=np.int32),
      "image_hw": np.full((n, 2), size, np.float32),
      "gt_boxes": gt, "gt_classes": np.asarray(gt_classes, np.int32),
      "gt_crowd": np.zeros(np.shape(gt_classes), np.int32),
      "gt_area": np.prod(gt[..., 2:] - gt[..., :2], axis=-1) * size * size,
      "det_boxes": np.asarray(det_boxes, np.float32), "det_scores": np.asarray(det_scores),
      "det_classes": np.asarray(det_classes, np.int32)}, count=n)


def _gt_scenes():
  rng = np.random.default_rng(0)
  lt = rng.uniform(0, 0.6, (20, 3, 2))
  gt = np.concatenate([lt, lt + rng.uniform(0.1, 0.35, (20, 3, 2))], -1)
  classes = rng.integers(1, 4, (20, 3))
  classes[::4, 2] = 0  # some images have two boxes only
  return gt, classes


def test_perfect_detections_score_1():
  gt, classes = _gt_scenes()
  real = classes > 0
  part = _rows(gt, classes, np.concatenate([gt, np.zeros_like(gt)], 1),
               np.concatenate([real * 0.9, np.zeros(real.shape)], 1),
               np.concatenate([classes, np.zeros_like(classes)], 1))
  metrics = coco.compute(config.mini(), part)
  assert metrics["mAP"] == pytest.approx(1.0) and metrics["AP50"] == pytest.approx(1.0)


def test_shifted_boxes_score_what_pycocotools_says(tmp_path):
  from pycocotools.coco import COCO
  from pycocotools.cocoeval import COCOeval

  gt, classes = _gt_scenes()
  rng = np.random.default_rng(1)
  shift = rng.uniform(-0.06, 0.06, gt.shape)
  dets = np.clip(gt + shift, 0, 1)
  scores = rng.uniform(0.1, 1.0, classes.shape) * (classes > 0)
  metrics = coco.compute(config.mini(), _rows(gt, classes, dets, scores, classes))

  # pycocotools the usual way: an annotation file and a result list, in pixels (100x100).
  images, anns, results = [], [], []
  for i in range(len(gt)):
    images.append({"id": i + 1, "height": 100, "width": 100})
    for g, d, s, c in zip(gt[i] * 100, dets[i] * 100, scores[i], classes[i]):
      if c == 0:
        continue
      anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": int(c), "iscrowd": 0,
                   "bbox": [g[0], g[1], g[2] - g[0], g[3] - g[1]],
                   "area": (g[2] - g[0]) * (g[3] - g[1])})
      results.append({"image_id": i + 1, "category_id": int(c), "score": float(s),
                      "bbox": [d[0], d[1], d[2] - d[0], d[3] - d[1]]})
  (tmp_path / "gt.json").write_text(json.dumps(
      {"images": images, "annotations": anns, "categories": [{"id": c} for c in range(1, 11)]}))
  coco_gt = COCO(str(tmp_path / "gt.json"))
  e = COCOeval(coco_gt, coco_gt.loadRes(results), iouType="bbox")
  e.evaluate()
  e.accumulate()
  e.summarize()
  assert 0.1 < e.stats[0] < 0.9
  assert metrics["mAP"] == pytest.approx(e.stats[0], abs=1e-12)
  assert metrics["AP50"] == pytest.approx(e.stats[1], abs=1e-12)


def test_one_box_at_iou_0_74_is_right_at_half_the_thresholds():
  # A 10x10 box found 1.5 px to the right: IoU 85/115 = 0.739, a hit at IoU
  # thresholds 0.50 ... 0.70 (5 of 10): AP@[.5:.95] = 0.5.
  part = _rows([[[0.1, 0.1, 0.2, 0.2]]], [[1]], [[[0.115, 0.1, 0.215, 0.2]]], [[0.9]], [[1]])
  assert coco.compute(config.mini(), part)["mAP"] == pytest.approx(0.5)


def test_an_image_evaluated_twice_is_refused():
  gt, classes = _gt_scenes()
  part = _rows(gt, classes, gt, np.ones(classes.shape), classes)
  part.rows["image_id"][3] = part.rows["image_id"][4]
  with pytest.raises(ValueError, match=r"images \[5\] were evaluated more than once"):
    coco.compute(config.mini(), part)


# ----------------------------------------------------------------- distributed evaluation


def _eval_config():
  """The mini config keeping 10 detections per image: an untrained model fills every
  slot, and pycocotools' time grows with the detections."""
  cfg = config.mini()
  return dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, max_detections=10))


@pytest.fixture(scope="module")
def initial_state():
  """A fixed random train state of the mini model, on the host (He-scaled kernels,
  zero biases, unit batch-norm statistics), built in numpy from the state's shapes:
  the same state goes onto every mesh."""
  cfg = _eval_config()
  init = steps.init_fn(WORKLOAD, cfg, WORKLOAD.optimizer(cfg, WORKLOAD.schedule(cfg)))
  shapes = jax.eval_shape(init, jax.ShapeDtypeStruct((), jnp.uint32))
  rng = np.random.default_rng(3)

  def leaf(path, x):
    name = sharding.path_str(path)
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      return jax.random.key(0)
    if len(x.shape) == 4:  # HWIO kernel
      fan_in = np.prod(x.shape[:3])
      return (rng.standard_normal(x.shape) * np.sqrt(2.0 / fan_in)).astype(x.dtype)
    fill = 1 if name.endswith(("scale", "var")) else 0
    return np.full(x.shape, fill, x.dtype)

  return jax.tree_util.tree_map_with_path(leaf, shapes)


def _eval_program(cfg, devices, host_state):
  """The eval step compiled for a mesh over `devices` with the shardings
  steps.compile_programs gives it, and the state placed on that mesh."""
  mesh = mesh_lib.make_mesh({"data": len(devices)}, devices=devices)
  state_sh = sharding.tree_shardings(host_state, WORKLOAD.partition_rules(cfg), mesh)
  batch_sh = mesh_lib.batch_sharding(mesh)
  ev = jax.jit(steps.eval_fn(WORKLOAD, cfg, StepContext(mesh=mesh)),
               in_shardings=(state_sh, batch_sh), out_shardings=batch_sh)
  return ev, jax.device_put(host_state, state_sh), batch_sh


def _evaluate(ssd_data_dir, host_state, devices, host=0, hosts=1):
  cfg = _eval_config()
  sched = WORKLOAD.schedule(cfg)
  step, state, batch_sh = _eval_program(cfg, devices, host_state)
  per_host = sched.eval_batch_size // hosts
  ds = data.eval_dataset(input_pipeline.files(cfg, ssd_data_dir, Split.EVAL),
                         input_pipeline.decode(cfg, Split.EVAL),
                         num_examples=sched.eval_examples, per_host_batch=per_host, host=host,
                         hosts=hosts)
  put = lambda b: mesh_lib.to_global(b, batch_sh, per_host)
  mine = len(range(host, sched.eval_examples, hosts))
  return evaluate.evaluate(WORKLOAD, cfg, step, state, data.prefetch(data.numpy_batches(ds), put),
                           mine)


def _sorted_rows(part):
  order = np.argsort(part.rows["image_id"])
  return {k: v[order] for k, v in part.rows.items()}


def test_distributed_evaluation_is_the_same_on_1_2_and_8_devices_and_2_hosts(ssd_data_dir,
                                                                           initial_state):
  # The same state on every mesh; 500 scenes in batches of 256, the last one padded
  # with 12 masked rows.
  single, part = _evaluate(ssd_data_dir, initial_state, jax.devices()[:1])
  assert part.count == 500
  ref = _sorted_rows(part)
  np.testing.assert_array_equal(ref["image_id"], np.arange(1, 501))
  assert (ref["det_scores"] > 0).sum() > 1000  # an untrained model detects plenty
  for n in (2, 8):
    metrics, part = _evaluate(ssd_data_dir, initial_state, jax.devices()[:n])
    rows = _sorted_rows(part)
    assert part.count == 500 and metrics["mAP"] == pytest.approx(single["mAP"], abs=1e-9)
    np.testing.assert_array_equal(rows["det_classes"], ref["det_classes"])
    np.testing.assert_allclose(rows["det_scores"], ref["det_scores"], rtol=1e-5, atol=1e-6)
  # Two hosts of 4 devices, each reading only its share of the files' examples; the
  # harness concatenates their rows (evaluate.across_processes does it across processes).
  parts = [_evaluate(ssd_data_dir, initial_state, jax.devices()[4 * h:4 * h + 4], host=h,
                     hosts=2)[1]
           for h in range(2)]
  assert [p.count for p in parts] == [250, 250]
  assert not set(parts[0].rows["image_id"]) & set(parts[1].rows["image_id"])
  merged = evaluate.merge(parts[0], parts[1])
  assert WORKLOAD.eval.compute(_eval_config(), merged)["mAP"] == pytest.approx(single["mAP"],
                                                                              abs=1e-9)



# ------------------------------------------------------------------------ batch norm groups


def test_batch_norm_groups_normalise_each_group_by_itself(initial_state):
  # With --bn-group-size, statistics come from each group of the batch alone (the
  # reference submissions' distributed batch norm): the training forward pass over two
  # groups is the forward pass of each half with ordinary batch norm.
  cfg = config.mini()
  images = WORKLOAD.synthetic_batch(cfg, Split.TRAIN, 8, np.random.default_rng(0))["image"]
  variables = {"params": initial_state.params, **initial_state.model_state}

  @functools.partial(jax.jit, static_argnums=0)
  def forward(groups, x):
    return train._model(cfg, groups).apply(variables, x, train=True,
                                           mutable=["batch_stats"])[0][1]

  grouped = np.asarray(forward(2, images))
  halves = np.concatenate([forward(1, images[:4]), forward(1, images[4:])])
  np.testing.assert_allclose(grouped, halves, rtol=1e-4, atol=1e-4)
  assert np.abs(grouped - np.asarray(forward(1, images))).max() > 1e-3
