"""MoE specifics: routing against a float64 loop, expert parallelism against one device,
the collectives of the compiled step, the pydoc data, the sizes, and the derived
checker rules of mlbench's own `moe` benchmark."""

from __future__ import annotations

import dataclasses
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mlbench import compliance, rules
from mlbench.train import data, mesh as mesh_lib, steps
from mlbench.pod.check import collectives
from mlbench.train.plan import harness_hparams
from mlbench.workload import Split, StepContext
from workloads.moe import WORKLOAD, config, input_pipeline, layer, pydoc_lm, train


def reference(x, router, wi, wo, *, k, capacity_factor, uniform=None):
  """GShard top-2 / Switch top-1 in float64, one token at a time; with `uniform`, the
  second expert only where uniform < 2 x its normalised gate (GShard's Algorithm 1).

  Returns (y, kept, aux, z, assigned): the layer output, the set of (group, token,
  expert, slot) assignments that fit in capacity, the two losses, and the number of
  assignments routed before capacity.
  """
  x, router, wi, wo = (np.asarray(a, np.float64) for a in (x, router, wi, wo))
  groups, tokens, _ = x.shape
  experts = router.shape[1]
  cap = math.ceil(capacity_factor * k * tokens / experts)
  y, kept, aux, z, assigned = np.zeros_like(x), set(), [], [], 0
  for g in range(groups):
    logits = x[g] @ router
    top = logits.max(-1)
    lse = top + np.log(np.exp(logits - top[:, None]).sum(-1))
    gates = np.exp(logits - lse[:, None])
    first = logits.argmax(-1)
    choices = [(first, gates[np.arange(tokens), first])]
    if k == 2:
      others = logits.copy()
      others[np.arange(tokens), first] = -np.inf
      second = others.argmax(-1)
      g1, g2 = choices[0][1], gates[np.arange(tokens), second]
      choices = [(first, g1 / (g1 + g2)), (second, g2 / (g1 + g2))]
    taken = np.zeros(experts, int)
    for i, (chosen, gate) in enumerate(choices):  # every first choice before any second
      for s in range(tokens):
        e = int(chosen[s])
        if i == 1 and uniform is not None and not uniform[g, s] < 2 * gate[s]:
          continue  # the second expert not drawn
        assigned += 1
        if taken[e] < cap:
          kept.add((g, s, e, int(taken[e])))
          taken[e] += 1
          y[g, s] += gate[s] * (np.maximum(x[g, s] @ wi[e], 0.0) @ wo[e])
    share = np.bincount(first, minlength=experts) / tokens
    aux.append(np.mean(share * gates.mean(0)) * experts ** 2)
    z.append(np.mean(lse ** 2))
  return y, kept, float(np.mean(aux)), float(np.mean(z)), assigned


def _weights(rng, groups=8, tokens=32, width=16, experts=8, hidden=24):
  return (rng.normal(size=(groups, tokens, width)).astype(np.float32),
          rng.normal(size=(width, experts)).astype(np.float32),
          (rng.normal(size=(experts, width, hidden)) / 4).astype(np.float32),
          (rng.normal(size=(experts, hidden, width)) / 4).astype(np.float32))


@pytest.mark.parametrize("k, capacity_factor, random", [
    (2, 1.0, False), (2, 0.5, False), (2, 2.0, False), (1, 1.0, False), (2, 1.0, True),
    (2, 2.0, True)])
def test_routing_matches_a_float64_loop_over_tokens(k, capacity_factor, random):
  rng = np.random.default_rng(k * 10 + int(4 * capacity_factor))
  x, router, wi, wo = _weights(rng)
  uniform = rng.uniform(size=x.shape[:2]).astype(np.float32) if random else None
  want, kept, aux, z, assigned = reference(x, router, wi, wo, k=k,
                                           capacity_factor=capacity_factor, uniform=uniform)
  got, stats = layer.moe_ffn(x, router, wi, wo, k=k, capacity_factor=capacity_factor,
                             uniform_GS=uniform)
  cap = layer.capacity(x.shape[1], router.shape[1], k, capacity_factor)
  routing = layer.route(jnp.einsum("gsm,me->gse", x, router), k=k, capacity_per_group=cap,
                        uniform_GS=uniform)
  placed = {tuple(int(i) for i in idx) for idx in np.argwhere(np.asarray(routing.dispatch_GSEC))}
  assert placed == kept  # the same tokens dropped, the same slots
  served = np.zeros(x.shape[:2], bool)
  for g, s, _, _ in kept:
    served[g, s] = True
  np.testing.assert_allclose(np.asarray(got)[served], want[served], rtol=2e-5, atol=2e-5)
  np.testing.assert_array_equal(np.asarray(got)[~served], 0.0)  # only the residual remains
  assert float(stats["aux_loss"]) == pytest.approx(aux, rel=1e-5)
  assert float(stats["z_loss"]) == pytest.approx(z, rel=1e-5)
  tokens = x.shape[0] * x.shape[1]
  # Every token's k choices, or, drawing the second, its first and some of its seconds.
  assert assigned == k * tokens if not random else tokens < assigned < k * tokens
  assert float(stats["dropped_assignments"]) == pytest.approx(1 - len(kept) / assigned)
  assert float(stats["dropped_tokens"]) == pytest.approx(1 - served.mean())
  if capacity_factor <= 1.0:
    assert 0 < len(kept) < assigned  # the capacity binds
  else:
    assert float(stats["dropped_assignments"]) == 0.0


def _loss(params, x, mesh):
  y, stats = layer.moe_ffn(x, *params, k=2, capacity_factor=1.0, mesh=mesh)
  return jnp.mean(y ** 2) + 1e-2 * stats["aux_loss"] + 1e-3 * stats["z_loss"], stats


@pytest.mark.parametrize("shape", [{"data": 2, "expert": 4}, {"expert": 8}, {"data": 8},
                                   {"data": 2, "model": 2, "expert": 2}])
def test_expert_parallel_gives_the_single_device_outputs_and_gradients(shape):
  x, *params = _weights(np.random.default_rng(7))
  mesh = mesh_lib.make_mesh(shape)
  grad = jax.value_and_grad(_loss, has_aux=True)
  (loss1, stats1), grads1 = jax.jit(lambda p, x: grad(p, x, None))(params, x)
  (loss8, stats8), grads8 = jax.jit(lambda p, x: grad(p, x, mesh))(params, x)
  y1, _ = layer.moe_ffn(x, *params, k=2, capacity_factor=1.0)
  y8, _ = jax.jit(lambda p, x: layer.moe_ffn(x, *p, k=2, capacity_factor=1.0, mesh=mesh))(
      params, x)
  np.testing.assert_allclose(np.asarray(y8), np.asarray(y1), rtol=1e-5, atol=1e-6)
  assert float(loss8) == pytest.approx(float(loss1), rel=1e-6)
  for key in stats1:
    assert float(stats8[key]) == pytest.approx(float(stats1[key]), rel=1e-6), key
  for g1, g8 in zip(grads1, grads8):
    np.testing.assert_allclose(np.asarray(g8), np.asarray(g1), rtol=1e-4, atol=1e-7)
  assert float(stats1["dropped_assignments"]) > 0  # the capacity binds here too


def _mini_without_dropout():
  cfg = config.mini()
  return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dropout=0.0))


def _programs(cfg, shape, devices=None):
  sched = WORKLOAD.schedule(cfg)
  mesh = mesh_lib.make_mesh(shape, devices=devices)
  ctx = StepContext(mesh=mesh)
  return steps.compile_programs(WORKLOAD, cfg, sched, mesh, ctx, WORKLOAD.optimizer(cfg, sched))


@pytest.fixture(scope="module")
def expert_parallel():
  return _programs(_mini_without_dropout(), {"data": 2, "expert": 4})


def test_the_compiled_expert_parallel_step_uses_all_to_all_and_gathers_no_tokens(
    expert_parallel):
  train_hlo, eval_hlo = expert_parallel.train.as_text(), expert_parallel.eval.as_text()
  moe_layers = train.num_moe_layers(config.mini())
  assert collectives(train_hlo)["all-to-all"] == 4 * moe_layers  # dispatch, combine; x2 backward
  assert collectives(train_hlo)["all-gather"] == 0
  assert collectives(eval_hlo)["all-to-all"] == 2 * moe_layers
  # The eval step gathers only its per-sequence outputs (rank 1) onto the data axis.
  gathered = re.findall(r"= (\w+)\[([\d,]*)\][^=]*? all-gather(?:-start)?\(", eval_hlo)
  assert all(len(dims.split(",")) == 1 for _, dims in gathered), gathered
  # The experts' kernels are split over `expert`, the router replicated.
  params = expert_parallel.state_sharding.params
  assert tuple(params["layer_1"]["moe"]["intermediate"].spec) == ("expert",)
  assert tuple(params["layer_1"]["moe"]["router"].spec) == ()


def test_expert_parallel_training_follows_single_device_training(expert_parallel):
  cfg = _mini_without_dropout()
  single = _programs(cfg, {"data": 1}, devices=jax.devices()[:1])
  rng = np.random.default_rng(0)
  batches = [WORKLOAD.synthetic_batch(cfg, Split.TRAIN, cfg.global_batch_size, rng)
             for _ in range(3)]
  params, metrics = [], []
  for programs in (single, expert_parallel):
    state, sums = programs.init_state(0), None
    for batch in batches:
      state, sums = programs.train(state, programs.fresh_sums(), mesh_lib.to_global(
          batch, programs.batch_sharding, cfg.global_batch_size))
    params.append(jax.device_get(state.params))
    metrics.append(jax.device_get(sums))
  for a, b in zip(jax.tree.leaves(params[0]), jax.tree.leaves(params[1])):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
  assert set(metrics[0]) >= {"moe_dropped_tokens", "moe_dropped_assignments",
                             "moe_load_max_over_mean", "moe_aux_loss", "moe_z_loss"}
  for key in metrics[0]:
    assert float(metrics[1][key]) == pytest.approx(float(metrics[0][key]), rel=1e-4), key


def test_the_mini_data_is_held_out_pydoc_text_in_fixed_sequences(moe_data_dir):
  cfg = config.mini()
  folder = input_pipeline.dataset_dir(cfg, moe_data_dir)

  def read(split):
    files = input_pipeline.files(cfg, moe_data_dir, split)
    ds = data.eval_dataset(files, input_pipeline.decode(cfg, split), num_examples=10 ** 9,
                           per_host_batch=1, host=0, hosts=1)
    return np.stack([b[input_pipeline.TOKENS][0] for b in data.numpy_batches(
        ds.take_while(lambda b: b[data.MASK][0] > 0))])

  train_seqs, eval_seqs = read(Split.TRAIN), read(Split.EVAL)
  assert train_seqs.shape == (cfg.data.train_examples, cfg.data.seq_length + 1)
  assert eval_seqs.shape == (cfg.data.eval_examples, cfg.data.seq_length + 1)
  assert train_seqs.dtype == np.int32 and 0 <= train_seqs.min() < train_seqs.max() < 1024
  # Evaluation sequences tile the held-out stream: each token is predicted once.
  np.testing.assert_array_equal(eval_seqs[1:, 0], eval_seqs[:-1, -1])
  from tokenizers import Tokenizer

  tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
  assert tokenizer.get_vocab_size() == cfg.model.vocab_size
  text = tokenizer.decode(eval_seqs[:20].reshape(-1).tolist())
  assert " the " in text and "\n" in text  # English prose, lines kept
  train_text, held_out = pydoc_lm.blocks()
  share = sum(map(len, held_out)) / sum(map(len, train_text + held_out))
  assert 0.07 < share < 0.12 and not set(held_out) & set(train_text)


def test_full_config_is_gshard_sized():
  cfg = config.full()
  counts = train.count_parameters(cfg)
  # 24 layers of width 1024: 12 dense (4 H^2 attention + 2 H*8192 MLP, with biases)
  # and 12 with a router and 64 experts of 2 H*8192 each (no biases); a tied
  # 32,000-token embedding; LayerNorms.
  assert counts["total"] == steps.count_params(WORKLOAD, cfg) == 13_220_755_456
  assert counts["active"] == 738_506_752  # 2 of 64 experts per MoE layer
  assert train.num_moe_layers(cfg) == 12 and cfg.model.moe.top_k == 2


def test_logged_keys_disclose_the_parallelism(expert_parallel):
  cfg = config.mini()
  sched = WORKLOAD.schedule(cfg)
  mesh = mesh_lib.make_mesh({"data": 2, "expert": 4})
  logged = WORKLOAD.hparams(cfg, sched, StepContext(mesh=mesh))
  assert logged["expert_parallelism"] == 4 and logged["tensor_parallelism"] == 1
  assert logged["micro_batch_size"] == cfg.global_batch_size // 8
  # The cosine runs from its peak (after the warmup) down to the end value: optax's
  # decay_steps counts the warmup in, MLPerf's opt_learning_rate_decay_steps does not.
  # Read off the schedule itself, not the config.
  o = cfg.optimizer
  lr = np.asarray(optax.warmup_cosine_decay_schedule(
      0.0, o.base_learning_rate, o.warmup_steps, o.max_steps,
      end_value=o.end_learning_rate)(np.arange(2 * o.max_steps)))
  peak = int(np.argmax(lr))
  decay = int(np.argmax(lr[peak:] <= o.end_learning_rate * (1 + 1e-6)))
  assert peak == o.warmup_steps and logged["opt_learning_rate_decay_steps"] == decay == 950
  rule = rules.load("moe", "mini")
  assert rule.problems({**harness_hparams(sched), **logged}, closed=True) == []
  assert rule.problems({**harness_hparams(sched), **logged, "opt_adamw_beta_2": 0.999},
                       closed=True) == ["opt_adamw_beta_2=0.999 must satisfy eq 0.95"]


def _moe_log(path, values, *, hparams_over=None, drop=()):
  from mlbench.mllog import MLLog

  cfg = config.mini()
  sched = WORKLOAD.schedule(cfg)
  hparams = {**harness_hparams(sched), **WORKLOAD.hparams(cfg, sched, StepContext(mesh=None)),
             **(hparams_over or {})}
  log = MLLog(path)
  log.cache_clear(False)
  log.init_start()
  log.submission(benchmark="moe", org="mlbench", division="closed", status="onprem",
                 platform="cpu-test")
  log.seed(1)
  log.hyperparameters({k: v for k, v in hparams.items() if k not in drop})
  log.init_stop()
  log.run_start()
  for i, value in enumerate(values):
    samples = 1600 * (i + 1)
    log.block_start(samples - 1600, 1600, samples - 1600)
    log.eval_start(samples, samples)
    log.eval_result("eval_accuracy", value, samples, samples)
    log.eval_stop(samples, samples)
    log.block_stop(samples - 1600, samples)
  log.run_stop(True)
  log.close()
  return path


def test_the_official_checker_judges_moe_logs_by_the_derived_rules(tmp_path):
  rule = rules.load("moe", "mini")
  assert rule.checker_benchmark == "gpt_oss_20b" and rule.modelled
  check = lambda name, *a, **kw: compliance.check_log(_moe_log(tmp_path / name, *a, **kw),
                                                      rule, tmp_path)
  verdict = check("good.txt", [4.5, 3.8, rule.quality.target - 0.01])
  assert verdict.passed, verdict.output
  assert "--config" in verdict.command and "--ruleset 6.1.0" in verdict.command
  missed = check("missed.txt", [4.5, rule.quality.target + 0.01])
  assert not missed.passed and "eval_accuracy" in missed.output
  beta = check("beta.txt", [3.0], hparams_over={"opt_adamw_beta_2": 0.999})
  assert not beta.passed and "opt_adamw_beta_2" in beta.output
  missing = check("aux.txt", [3.0], drop=("moe_aux_loss_coeff",))
  assert not missing.passed and "moe_aux_loss_coeff" in missing.output
  undisclosed = check("ep.txt", [3.0], drop=("expert_parallelism",))
  assert not undisclosed.passed and "expert_parallelism" in undisclosed.output


def test_derived_rules_add_moe_and_leave_the_official_files_alone(tmp_path):
  import yaml

  rule = rules.load("moe", "mini")
  derived = compliance.checker_config(rule, tmp_path).parent
  official = compliance.checker_package_dir() / "training_6.1.0"
  load = lambda path: yaml.load(path.read_text(), Loader=yaml.BaseLoader)
  strip = lambda text: text.replace(f"{derived.parent.resolve()}/", "")
  assert yaml.load(strip((derived / "closed_gpt_oss_20b.yaml").read_text()),
                   Loader=yaml.BaseLoader) == load(official / "closed_gpt_oss_20b.yaml")
  accepted = {r["KEY"]["NAME"]: r["KEY"] for r in load(derived / "closed_common.yaml")}
  assert "'gpt_oss_20b', 'moe'" in accepted["submission_benchmark"]["CHECK"]
  ours = {r["KEY"]["NAME"]: r["KEY"] for r in load(derived / "closed_moe.yaml")}
  theirs = {r["KEY"]["NAME"]: r["KEY"] for r in load(official / "closed_gpt_oss_20b.yaml")}
  assert set(ours) == set(theirs) | {"moe_aux_loss_coeff"}
  assert "CHECK" not in ours["max_sequence_length"]  # gpt_oss_20b's 8192: required, free
  assert ours["opt_adamw_beta_2"]["CHECK"] == "v['value'] == 0.95"
  assert ours["opt_learning_rate_warmup_steps"]["POST"] == theirs[
      "opt_learning_rate_warmup_steps"]["POST"]
  assert f"<= {rule.quality.target!r})" in ours["eval_accuracy"]["ATLEAST_ONE_CHECK"]
  open_ours = {r["KEY"]["NAME"]: r["KEY"] for r in load(derived / "open_moe.yaml")}
  assert "CHECK" not in open_ours["moe_aux_loss_coeff"]  # open: required, unconstrained
