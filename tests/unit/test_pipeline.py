"""GPipe pipeline stages over a `stage` mesh axis, on 8 simulated devices.

The schedule against a plain scan over the same layers (values, gradients, the layers'
aux outputs), a mini Llama through the harness's compiled step against data
parallelism, and the one-line errors for schedules that cannot run.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from mlbench import config as config_lib, registry
from mlbench.config import RunConfig
from mlbench.errors import UserError
from mlbench.train import mesh as mesh_lib, pipeline, sharding, steps
from mlbench.train.plan import make_plan
from mlbench.train.runtime import Runtime
from mlbench.workload import Split, StepContext

LAYERS, WIDTH, BATCH = 8, 16, 32


def _layer(p, h_BX, extras, shared, key):
  """A residual tanh layer that also takes a per-row scale and a shared bias."""
  del key
  (scale_B,), (bias_X,) = extras, shared
  h_BX = h_BX + jnp.tanh(h_BX @ p["w"] + p["b"] + bias_X) * scale_B[:, None]
  return h_BX, {"mean": h_BX.mean()}


def _reference(params, x_BX, scale_B, bias_X):
  def one(h, p):
    return _layer(p, h, (scale_B,), (bias_X,), None)

  y, aux = jax.lax.scan(one, x_BX, params)
  return y, {"mean": aux["mean"].sum()}


def _toy():
  rng = np.random.default_rng(0)
  params = {"w": rng.standard_normal((LAYERS, WIDTH, WIDTH)).astype(np.float32) / 4,
            "b": rng.standard_normal((LAYERS, WIDTH)).astype(np.float32) / 4}
  return (params, rng.standard_normal((BATCH, WIDTH)).astype(np.float32),
          rng.uniform(0.5, 1.5, BATCH).astype(np.float32),
          rng.standard_normal(WIDTH).astype(np.float32))


@pytest.mark.parametrize("shape,micro", [({"data": 2, "stage": 4}, 8),
                                         ({"data": 2, "stage": 2, "model": 2}, 4)])
def test_the_schedule_computes_what_a_scan_does_forward_and_backward(shape, micro):
  params, x, scale, bias = _toy()
  mesh = mesh_lib.make_mesh(shape)
  stacked = NamedSharding(mesh, P("stage"))

  def loss(fn, params, x):
    y, aux = fn(params, x)
    return (y ** 2).mean() + aux["mean"], (y, aux)

  def piped(params, x):
    return pipeline.gpipe(_layer, params, x, mesh=mesh, microbatches=micro,
                          per_example=(scale,), shared=(bias,))

  grad = jax.jit(jax.value_and_grad(lambda p, x: loss(piped, p, x), has_aux=True),
                 in_shardings=({"w": stacked, "b": stacked}, mesh_lib.batch_sharding(mesh)))
  compiled = grad.lower(params, x).compile()
  (_, (y, aux)), g = compiled(params, x)
  (_, (y_ref, aux_ref)), g_ref = jax.value_and_grad(
      lambda p, x: loss(lambda p, x: _reference(p, x, scale, bias), p, x), has_aux=True)(
          params, x)
  np.testing.assert_allclose(y, y_ref, atol=1e-6)
  np.testing.assert_allclose(aux["mean"], aux_ref["mean"], rtol=1e-6)
  for k in g:
    np.testing.assert_allclose(g[k], g_ref[k], atol=1e-6)
  # The stage hand-offs, forward and backward, are collective-permutes.
  assert "collective-permute" in compiled.as_text()
  assert y.sharding.spec == P(("data", "stage"))  # the head runs split over both


def test_the_bubble():
  assert pipeline.bubble_fraction(1, 1) == 0.0
  assert pipeline.bubble_fraction(4, 4) == pytest.approx(3 / 7)
  assert pipeline.bubble_fraction(4, 16) == pytest.approx(3 / 19)


@pytest.fixture(scope="module")
def llama():
  """The mini Llama with scanned layers, compiled data-only and with two stages."""
  w = registry.get("llama31_8b")
  cfg = config_lib.override(w.configs["mini"](), ["model.scan_layers=true",
                                                  "data.seq_length=64"])
  sched = w.schedule(cfg)
  out = {}
  for shape, micro in (({"data": 4}, 1), ({"data": 4, "stage": 2}, 2)):
    n = int(np.prod(list(shape.values())))
    mesh = mesh_lib.make_mesh(shape, devices=jax.devices()[:n])
    ctx = StepContext(mesh=mesh, microbatches=micro)
    out[n] = steps.compile_programs(w, cfg, sched, mesh, ctx, w.optimizer(cfg, sched))
  return w, cfg, sched, out


def _losses(w, cfg, sched, programs, steps_=3):
  batch = w.synthetic_batch(cfg, Split.TRAIN, sched.global_batch_size, np.random.default_rng(0))
  device_batch = mesh_lib.to_global(batch, programs.batch_sharding, sched.global_batch_size)
  state, out = programs.init_state(0), []
  for _ in range(steps_):
    state, sums = programs.train(state, programs.fresh_sums(), device_batch)
    out.append(float(jax.device_get(sums)["loss"]))
  return np.array(out)


@pytest.mark.slow
def test_two_stages_train_like_data_parallelism_in_less_memory(llama):
  w, cfg, sched, programs = llama
  data_only, staged = programs[4], programs[8]
  np.testing.assert_allclose(_losses(w, cfg, sched, staged), _losses(w, cfg, sched, data_only),
                             rtol=1e-5)
  assert "collective-permute" in staged.train.as_text()
  assert "collective-permute" not in data_only.train.as_text()
  params = jax.eval_shape(lambda k: w.init(cfg, k)[0], jax.random.key(0))

  def per_device(p):
    return (sharding.bytes_per_device(params, p.state_sharding.params) + p.opt_state_bytes,
            p.train.memory_analysis().temp_size_in_bytes)

  # Each stage holds half of the stack's parameters and optimizer state, and half the
  # layers' activations.
  (state_1, temp_1), (state_2, temp_2) = per_device(data_only), per_device(staged)
  assert state_2 < state_1 and temp_2 < temp_1
  kernel = staged.state_sharding.params["layers"]["layer"]["mlp"]["up"]["kernel"]
  assert kernel.spec[0] == "stage"


def _plan(workload, mesh, *overrides):
  devices = jax.devices()[:int(np.prod([n for _, n in mesh]))]
  rc = RunConfig(workload=workload, overrides=tuple(overrides), mesh=mesh)
  return make_plan(rc, Runtime(0, 1, devices, devices))


@pytest.mark.parametrize("workload,mesh,overrides,message", [
    ("llama31_8b", (("data", 4), ("spatial", 2)), (), "has no images to split by height"),
    ("resnet50", (("data", 4), ("stage", 2)), (), "has no layer stack"),
    ("llama31_8b", (("data", 4), ("stage", 2)), (), r"--set model\.scan_layers=true"),
    ("llama31_8b", (("data", 2), ("stage", 4)), ("model.scan_layers=true",),
     "does not divide the 2 layers"),
    ("llama31_8b", (("data", 4), ("stage", 2)),
     ("model.scan_layers=true", "pipeline.microbatches=3"), "not a multiple of the 2 stages"),
    ("llama31_8b", (("data", 4), ("stage", 2)),
     ("model.scan_layers=true", "pipeline.microbatches=4"),
     "global_batch_size gives 2 examples per data-parallel replica"),
    ("llama31_8b", (("data", 8),), ("pipeline.microbatches=4",), "needs pipeline stages"),
    ("llama31_8b", (("data", 8),), ("pipeline.stages=4",), "unknown config key"),
])
def test_bad_combinations_are_one_line_errors(workload, mesh, overrides, message):
  with pytest.raises(UserError, match=message) as e:
    _plan(workload, mesh, *overrides)
  assert "\n" not in str(e.value)


def test_a_spatial_group_may_hold_less_than_one_image_per_device():
  plan = _plan("resnet50", (("data", 2), ("spatial", 4)), "global_batch_size=2",
               "eval_batch_size=2")
  assert plan.gbs / plan.mesh.devices.size == 0.25  # each image on 4 devices
  assert plan.ctx.bn_groups == 1


def test_a_plan_carries_the_microbatches_and_logs_the_stages():
  plan = _plan("llama31_8b", (("data", 2), ("stage", 2)), "model.scan_layers=true",
               "pipeline.microbatches=4")
  assert plan.ctx.microbatches == 4
  assert plan.hparams["pipeline_parallelism"] == 2
  assert plan.hparams["micro_batch_size"] == 1  # 8 sequences / 2 replicas / 4 microbatches
  default = _plan("llama31_8b", (("data", 4), ("stage", 2)), "model.scan_layers=true")
  assert default.ctx.microbatches == 2  # as many as stages


@pytest.mark.slow
def test_moe_groups_of_layers_pipeline_with_their_routing_statistics():
  """The MoE LM's stack is groups of a dense and an MoE layer whose routing statistics
  (aux outputs) come back averaged over the microbatches; with an expert axis too."""
  w = registry.get("moe")
  cfg = config_lib.override(w.configs["mini"](), ["model.scan_layers=true", "model.num_layers=4",
                                                  "model.dropout=0", "data.seq_length=32",
                                                  "model.moe.second_expert=all"])
  batch = w.synthetic_batch(cfg, Split.TRAIN, cfg.global_batch_size, np.random.default_rng(0))
  params, _ = w.init(cfg, jax.random.key(0))
  out = []
  for shape in ({"data": 4}, {"data": 2, "stage": 2, "expert": 2}):
    n = int(np.prod(list(shape.values())))
    ctx = StepContext(mesh=mesh_lib.make_mesh(shape, devices=jax.devices()[:n]), microbatches=2)
    loss, (_, metrics) = jax.jit(lambda p, b: w.loss(cfg, ctx, p, {}, b, jax.random.key(1)))(
        params, batch)
    out.append({"loss": loss, **metrics})
  assert out[0].keys() == out[1].keys() and "moe_aux_loss" in out[0]
  for k in out[0]:
    np.testing.assert_allclose(out[1][k], out[0][k], rtol=1e-5, err_msg=k)
  # GShard's random second-expert dispatch draws from its own `gating` stream inside the
  # pipelined stages too (other draws than the scan's, as dropout's): fewer tokens reach
  # a second expert than with every one dispatched.
  random = dataclasses.replace(cfg, model=dataclasses.replace(
      cfg.model, moe=dataclasses.replace(cfg.model.moe, second_expert=type(
          cfg.model.moe.second_expert).RANDOM)))
  loss, _ = jax.jit(lambda p, b: w.loss(random, ctx, p, {}, b, jax.random.key(1)))(params, batch)
  assert np.isfinite(loss) and abs(float(loss) - float(out[1]["loss"])) > 1e-6


def test_check_reports_the_bubble_and_the_stage_hand_offs():
  from mlbench.pod import check, parallel

  plan = _plan("llama31_8b", (("data", 2), ("stage", 2)), "model.scan_layers=true",
               "data.seq_length=32", "pipeline.microbatches=4")
  got = parallel.report(plan, check.dry_run(plan))
  assert (got.stages, got.microbatches, got.layers_per_stage) == (2, 4, 1)
  assert got.bubble_fraction == pytest.approx(1 / 5) and got.mfu_ceiling == pytest.approx(0.8)
  assert got.halo_permutes > 0 and got.halo_bytes > 0
  assert got.step_floor_s is None  # no accelerator peak on a CPU
  assert 0 < got.state_bytes < got.peak_bytes
  text = parallel.lines(got)
  assert len(text) == 1 and "bubble (S-1)/(M+S-1) = 20.0%" in text[0] and "MFU <= 80.0%" in text[0]
