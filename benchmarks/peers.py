"""What a user would run instead of mlbench's train step: the same model in PyTorch.

Built from mlbench's own config of the workload (same sizes, same batch, same synthetic
batch), each compiled with `torch.compile`, bf16 autocast for `--precision bfloat16`:
- bert: Hugging Face `BertForPreTraining` (SDPA attention, masked-LM and next-sentence
  losses; it computes masked-LM logits at every position, more work than the reference's
  masked positions only), fused AdamW (PyTorch has no LAMB);
- resnet50: torchvision's ResNet with the config's stages (ResNet-50 for the full config),
  channels-last, SGD with momentum;
- llama31_8b: Hugging Face `LlamaForCausalLM` (SDPA attention, Llama 3 RoPE scaling,
  untied embeddings, activation checkpointing where the config rematerialises), fused AdamW.

    python benchmarks/peers.py --workload bert --config full --batch 32 --precision bfloat16

Prints one JSON line: step ms (median of `--steps` after `--warmup`), samples/s, peak GPU
memory. `accelerator_step.py` runs it in a subprocess before JAX starts (each framework
keeps the GPU's memory to itself) and prints the ratio; it skips the peers where PyTorch,
torchvision or transformers is not installed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np

PEERS = ("bert", "resnet50", "llama31_8b")


def available() -> bool:
  """Whether PyTorch, torchvision and transformers are installed."""
  import importlib.util

  return all(importlib.util.find_spec(m) for m in ("torch", "torchvision", "transformers"))


def _bert(cfg: Any, batch: dict[str, np.ndarray], torch: Any):
  from transformers import BertConfig, BertForPreTraining

  m = cfg.model
  config = BertConfig(vocab_size=m.vocab_size, hidden_size=m.hidden_size,
                      num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads,
                      intermediate_size=m.intermediate_size, hidden_act="gelu_new",
                      hidden_dropout_prob=m.dropout, attention_probs_dropout_prob=m.dropout,
                      max_position_embeddings=m.max_position_embeddings,
                      type_vocab_size=m.type_vocab_size, layer_norm_eps=m.layer_norm_epsilon)
  model = BertForPreTraining._from_config(config, attn_implementation="sdpa")
  labels = np.full(batch["input_ids"].shape, -100, np.int64)
  np.put_along_axis(labels, batch["masked_lm_positions"], batch["masked_lm_ids"], axis=1)
  inputs = {"input_ids": batch["input_ids"], "token_type_ids": batch["segment_ids"],
            "attention_mask": batch["input_mask"], "labels": labels,
            "next_sentence_label": batch["next_sentence_labels"]}
  return model, {k: torch.as_tensor(np.asarray(v, np.int64)) for k, v in inputs.items()}, "adamw"


def _resnet(cfg: Any, batch: dict[str, np.ndarray], torch: Any):
  from torchvision.models.resnet import Bottleneck, ResNet

  model = ResNet(Bottleneck, list(cfg.model.stage_sizes), num_classes=cfg.model.num_classes)
  images = torch.as_tensor(batch["image"]).permute(0, 3, 1, 2).contiguous(
      memory_format=torch.channels_last)
  return model, {"x": images, "labels": torch.as_tensor(batch["label"], dtype=torch.int64)}, "sgd"


def _llama(cfg: Any, batch: dict[str, np.ndarray], torch: Any):
  from transformers import LlamaConfig, LlamaForCausalLM

  m, seq = cfg.model, cfg.data.seq_length
  rope = m.rope
  scaling = ({"rope_type": "llama3", "factor": rope.factor,
              "low_freq_factor": rope.low_freq_factor, "high_freq_factor": rope.high_freq_factor,
              "original_max_position_embeddings": rope.original_context}
             if rope.scaled else None)
  config = LlamaConfig(vocab_size=m.vocab_size, hidden_size=m.width,
                       intermediate_size=m.mlp_size, num_hidden_layers=m.num_layers,
                       num_attention_heads=m.num_heads, num_key_value_heads=m.num_kv_heads,
                       max_position_embeddings=max(seq, rope.original_context),
                       rms_norm_eps=m.norm_epsilon, rope_theta=rope.theta,
                       rope_scaling=scaling, tie_word_embeddings=False)
  model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
  if m.remat.value != "none":
    model.gradient_checkpointing_enable()
  tokens = torch.as_tensor(np.asarray(next(iter(batch.values())), np.int64))
  return model, {"input_ids": tokens[:, :-1], "labels": tokens[:, :-1]}, "adamw"


def _step_fn(name: str, model: Any, optimizer: Any, torch: Any, dtype: Any, device: str):
  """One optimizer step on `inputs` under autocast (`dtype` None: none)."""
  compiled = torch.compile(model)

  def loss_of(inputs: dict[str, Any]) -> Any:
    if name == "resnet50":
      logits = compiled(inputs["x"])
      return torch.nn.functional.cross_entropy(logits.float(), inputs["labels"])
    return compiled(**inputs).loss

  def step(inputs: dict[str, Any]) -> None:
    with torch.autocast(device, dtype=dtype, enabled=dtype is not None):
      loss = loss_of(inputs)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

  return step


def measure(name: str, cfg: Any, batch: dict[str, np.ndarray], *, precision: str, steps: int,
            warmup: int) -> dict[str, Any]:
  """Times the peer's train step on `batch` (mlbench's synthetic batch of `cfg`)."""
  import torch

  device = "cuda" if torch.cuda.is_available() else "cpu"
  build = {"bert": _bert, "resnet50": _resnet, "llama31_8b": _llama}[name]
  model, inputs, opt = build(cfg, batch, torch)
  model = model.to(device).train()
  if name == "resnet50":
    model = model.to(memory_format=torch.channels_last)
  inputs = {k: v.to(device) for k, v in inputs.items()}
  fused = device == "cuda"
  optimizer = (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if opt == "sgd" else
               torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused))
  dtype = torch.bfloat16 if precision == "bfloat16" else None
  step = _step_fn(name, model, optimizer, torch, dtype, device)
  sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
  t0 = time.perf_counter()
  step(inputs)
  sync()
  compile_s, times = time.perf_counter() - t0, []
  for i in range(warmup + steps):
    t = time.perf_counter()
    step(inputs)
    sync()
    if i >= warmup:
      times.append(time.perf_counter() - t)
  step_s, size = statistics.median(times), len(next(iter(batch.values())))
  peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
  return {"peer": {"bert": "HF BertForPreTraining", "resnet50": "torchvision ResNet",
                   "llama31_8b": "HF LlamaForCausalLM"}[name],
          "torch": torch.__version__, "device": device, "batch": size, "step_ms": 1e3 * step_s,
          "samples_per_s": size / step_s, "compile_s": compile_s, "peak_bytes": peak}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--workload", required=True, choices=PEERS)
  ap.add_argument("--config", choices=("mini", "full"), default="mini")
  ap.add_argument("--precision", choices=("float32", "bfloat16"), default="bfloat16")
  ap.add_argument("--batch", type=int, help="[default: accelerator_step.py's]")
  ap.add_argument("--set", action="append", default=[], help="more --set KEY=VALUE overrides")
  ap.add_argument("--steps", type=int, default=10)
  ap.add_argument("--warmup", type=int, default=3)
  args = ap.parse_args()

  from common import config_for

  from mlbench.workload import Split

  # The peers train one padded sequence a row (HF BertForPreTraining has no packing).
  padded = ["data.max_sequences_per_row=1"] if args.workload == "bert" else []
  w, cfg = config_for(args.workload, args.config, args.precision, args.batch, [*args.set, *padded])
  batch = w.synthetic_batch(cfg, Split.TRAIN, w.schedule(cfg).global_batch_size,
                            np.random.default_rng(0))
  print(json.dumps(measure(args.workload, cfg, batch, precision=args.precision,
                           steps=args.steps, warmup=args.warmup)))


if __name__ == "__main__":
  main()
