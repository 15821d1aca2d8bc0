"""One attention entry point for every workload, and the record of what it chose.

`attend` computes softmax(q k^T / sqrt(D) + masks) v with the fastest implementation the
platform has that can serve the call's shape and masks, and says which one and why:
- GPUs: cuDNN's fused flash attention (`jax.nn.dot_product_attention(implementation=
  "cudnn")`) where jax's own checks take the call (`cudnn`: bfloat16/float16, the head
  sizes of the GPU generation, even lengths to train with a bias), causal and padding
  masks as sequence lengths, grouped-query attention, other masks as a bias;
- TPUs: the Pallas kernels (`mlbench.train.attention.tpu`): splash attention (causal,
  padding and packed sequences as segment ids, grouped-query heads), flash attention
  where the call adds a bias, and, for training with attention dropout (BERT's and the
  Transformer's reference 0.1), mlbench's own fused kernel that drops out inside
  (`dropout_kernel`: masks drawn from the layer's key for the step by a hash of each
  score's coordinates, `dropout_bits`, drawn again in the backward pass, never stored);
  each under `shard_map` over the mesh's batch and head axes;
- CPUs and anything a kernel cannot serve: XLA's own attention, which materialises the
  L x S scores (with dropout, its [B, N, L, S] mask and random bits too).
On GPUs a call with attention dropout stays on XLA: cuDNN's dropout seed is a Python int
fixed in the compiled program, and no GPU run here has shown its masks change per step.
XLA's paths live in `xla`, the TPU kernels in `tpu` and `dropout_kernel`.
`--set model.attention=auto|xla|cudnn|pallas` overrides; a forced kernel that cannot serve
a call is a one-line error. `recording()` collects the choices made while programs are
traced, for `mlbench check` and the run's log.

Masks: `causal`; `kv_lengths_B` (right padding: keys at positions >= the length are
padding); `q_segments_BL`/`kv_segments_BS` (packed sequences: a query attends to the keys
of its own segment; 0 marks padding); `bias` (added to the logits, broadcastable to
[B, N, L, S]). Outputs at padded query positions are unspecified (implementations differ
there); nothing downstream may depend on them.

Shape suffixes: B batch, L query length, S key length, N query heads, K key/value heads
(K divides N), D head size.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp

from mlbench.errors import UserError
from mlbench.fields import AttentionImpl
from mlbench.train.attention import xla
from mlbench.train.attention.xla import (NEG_INF, Dropout, allowed_mask, attention_with_dropout,
                                         softmax_in)

__all__ = ["NEG_INF", "Choice", "Dropout", "Site", "Used", "allowed_mask", "attend",
           "attention_with_dropout", "choose", "platform_of", "program", "recording",
           "softmax_in", "unrecorded"]

NATIVE = {"gpu": AttentionImpl.CUDNN, "tpu": AttentionImpl.PALLAS}
"""The fused implementation of each platform that has one."""


@dataclasses.dataclass(frozen=True)
class Site:
  """What a choice depends on: one attention call's shapes, dtype and masks."""

  name: str
  batch: int
  q_len: int
  kv_len: int
  heads: int
  kv_heads: int
  head_dim: int
  dtype: str
  causal: bool = False
  padding: bool = False
  packed: bool = False
  bias: bool = False
  dropout: float = 0.0
  bias_dtype: str = ""  # the bias's dtype, where there is one
  training: bool = True  # differentiated (in a train step, or in a program of no name)

  def describe(self) -> str:
    """'self-attention, 512 x 512 tokens, 16 heads of 64, bfloat16, padding'."""
    heads = f"{self.heads} heads of {self.head_dim}"
    if self.kv_heads != self.heads:
      heads += f" ({self.kv_heads} key/value heads)"
    masks = [m for m, on in (("causal", self.causal), ("padding", self.padding),
                             ("segments", self.packed), ("bias", self.bias)) if on]
    if self.dropout:
      masks.append(f"dropout {self.dropout:g}")
    return ", ".join([self.name, f"{self.q_len} x {self.kv_len} tokens", heads, self.dtype,
                      *masks])


@dataclasses.dataclass(frozen=True)
class Choice:
  """The implementation that computes a call, and why it was chosen."""

  implementation: AttentionImpl
  reason: str


def platform_of(mesh: Any) -> str:
  """The platform the program is compiled for: its mesh's devices' (a TPU topology's
  devices when `check --topology` compiles on a CPU), else JAX's default backend."""
  if mesh is not None:
    return str(mesh.devices.flat[0].platform)
  return jax.default_backend()


def choose(requested: AttentionImpl, platform: str, site: Site, *, stages: int = 1) -> Choice:
  """The implementation for `site` on `platform` (`stages`: the mesh's pipeline stages).

  Raises:
    UserError: `requested` is a kernel that cannot serve `site`, in one line.
  """
  if requested is AttentionImpl.XLA:
    return Choice(AttentionImpl.XLA, "model.attention=xla")
  if requested is AttentionImpl.AUTO:
    native = NATIVE.get(platform)
    if native is None:
      return Choice(AttentionImpl.XLA, f"no fused attention kernel on {platform}")
    why_not = _cannot(native, site, platform, stages)
    if why_not:
      return Choice(AttentionImpl.XLA, f"{native.value} cannot serve it: {why_not}")
    return Choice(native, _kernel_name(native, site))
  why_not = _cannot(requested, site, platform, stages)
  if why_not:
    raise UserError(f"model.attention={requested.value} cannot serve the {site.describe()}: "
                    f"{why_not}; set model.attention=auto or xla")
  reason = f"model.attention={requested.value}: {_kernel_name(requested, site)}"
  if platform != "tpu" and requested is AttentionImpl.PALLAS:
    reason += ", run by Pallas's interpreter on the CPU (slow: for checking, not speed)"
  return Choice(requested, reason)


def _kernel_name(impl: AttentionImpl, site: Site) -> str:
  if impl is AttentionImpl.CUDNN:
    return "cuDNN fused flash attention"
  if site.dropout:
    return "Pallas fused attention with the dropout in the kernel (mlbench's)"
  return "Pallas flash attention (with the bias)" if site.bias else "Pallas splash attention"


def _cannot(impl: AttentionImpl, site: Site, platform: str, stages: int) -> str:
  """Why `impl` cannot serve `site` ("" when it can)."""
  if impl is AttentionImpl.CUDNN and platform != "gpu":
    return f"cuDNN runs on NVIDIA GPUs, this program is for {platform}"
  if impl is AttentionImpl.PALLAS and platform not in ("tpu", "cpu"):
    return f"the Pallas attention kernels are TPU kernels, this program is for {platform}"
  if site.dropout and impl is AttentionImpl.CUDNN:
    return (f"attention dropout {site.dropout:g} in training: cuDNN's dropout seed is a "
            "Python int in the compiled program's backend config (jax's "
            "fused_attention_stablehlo), and no GPU run here has shown its masks change "
            "from step to step")
  if impl is AttentionImpl.CUDNN:
    return _cannot_cudnn(site)
  return _cannot_pallas(site, stages)


def _cannot_cudnn(site: Site) -> str:
  from mlbench.train.attention import cudnn

  if site.dtype not in ("bfloat16", "float16"):
    return f"it computes in {site.dtype}; cuDNN needs bfloat16 or float16 (--precision bfloat16)"
  if site.q_len == 1:
    return "one query position (decoding)"
  return cudnn.refusal(site)


def _cannot_pallas(site: Site, stages: int) -> str:
  from mlbench.train.attention import tpu

  if stages > 1:
    return "it runs inside pipeline stages, whose shard_map over `stage` holds the layers"
  return tpu.cannot(site)


_RECORD: contextvars.ContextVar[list[tuple[str, Site, Choice]] | None] = \
    contextvars.ContextVar("mlbench_attention_record", default=None)
_PROGRAM: contextvars.ContextVar[tuple[str, Any]] = contextvars.ContextVar(
    "mlbench_attention_program", default=("", None))


@dataclasses.dataclass(frozen=True)
class Used:
  """What one program's attention calls of one kind run on: `calls` traced calls of `site`."""

  program: str
  site: Site
  choice: Choice
  calls: int

  def line(self) -> str:
    return (f"{self.program}: {self.site.describe()}: {self.choice.implementation.value}"
            f" - {self.choice.reason}")

  def to_json(self) -> dict[str, Any]:
    # Calls traced, not run: a scanned layer stack traces its one layer (once per remat).
    return {"program": self.program, "site": self.site.describe(), "traced_calls": self.calls,
            "implementation": self.choice.implementation.value, "reason": self.choice.reason}


@contextlib.contextmanager
def recording() -> Iterator[list[Used]]:
  """Collects the choices of the calls traced inside (under `program(...)` labels); the
  yielded list is filled on exit, one `Used` per program and kind of call."""
  calls: list[tuple[str, Site, Choice]] = []
  used: list[Used] = []
  token = _RECORD.set(calls)
  try:
    yield used
  finally:
    _RECORD.reset(token)
    counts: dict[tuple[str, Site, Choice], int] = {}
    for key in calls:
      counts[key] = counts.get(key, 0) + 1
    used.extend(Used(p, s, c, n) for (p, s, c), n in counts.items())


@contextlib.contextmanager
def unrecorded() -> Iterator[None]:
  """Calls traced inside are not recorded: traces for shapes only, which never run (a
  decoder's cache built by `jax.eval_shape` of its init)."""
  token = _RECORD.set(None)
  try:
    yield
  finally:
    _RECORD.reset(token)


@contextlib.contextmanager
def program(name: str, mesh: Any = None) -> Iterator[None]:
  """Labels the attention calls traced inside as `name`'s ("train step", "eval step"),
  compiled for `mesh`: the mesh of calls that are given none (a model that does not carry
  `StepContext.mesh` down to its attention still gets its platform's kernels)."""
  token = _PROGRAM.set((name, mesh))
  try:
    yield
  finally:
    _PROGRAM.reset(token)


def attend(q_BLND: jax.Array, k_BSKD: jax.Array, v_BSKD: jax.Array, *,
           name: str = "attention", implementation: AttentionImpl = AttentionImpl.AUTO,
           mesh: Any = None, causal: bool = False, kv_lengths_B: jax.Array | None = None,
           q_segments_BL: jax.Array | None = None, kv_segments_BS: jax.Array | None = None,
           bias: jax.Array | None = None, dropout: Dropout | None = None,
           chunk: int = 0) -> jax.Array:
  """softmax(q k^T / sqrt(D) + masks) v, [B, L, N, D], by the implementation `choose`
  picks for this call (see the module docstring for the masks). `name` says which
  attention of the model this is in reports; `mesh` is `StepContext.mesh`; `chunk`
  (XLA, causal only) computes query blocks of that many positions one at a time."""
  site = Site(name=name, batch=q_BLND.shape[0], q_len=q_BLND.shape[1], kv_len=k_BSKD.shape[1],
              heads=q_BLND.shape[2], kv_heads=k_BSKD.shape[2], head_dim=q_BLND.shape[3],
              dtype=jnp.dtype(q_BLND.dtype).name, causal=causal,
              padding=kv_lengths_B is not None or kv_segments_BS is not None,
              packed=q_segments_BL is not None, bias=bias is not None,
              dropout=dropout.rate if dropout is not None else 0.0,
              bias_dtype="" if bias is None else jnp.dtype(bias.dtype).name,
              training=_PROGRAM.get()[0] != "eval step")
  from mlbench.train import pipeline

  mesh = mesh if mesh is not None else _PROGRAM.get()[1]
  platform = platform_of(mesh)
  choice = choose(implementation, platform, site, stages=pipeline.stage_count(mesh))
  calls = _RECORD.get()
  if calls is not None:
    calls.append((_PROGRAM.get()[0], site, choice))
  masks = dict(causal=causal, kv_lengths_B=kv_lengths_B, q_segments_BL=q_segments_BL,
               kv_segments_BS=kv_segments_BS, bias=bias)
  if choice.implementation is AttentionImpl.PALLAS:
    from mlbench.train.attention import tpu

    return tpu.attend(q_BLND, k_BSKD, v_BSKD, mesh=mesh, interpret=platform != "tpu",
                      dropout=dropout, **masks)
  if choice.implementation is AttentionImpl.CUDNN:
    return _cudnn(q_BLND, k_BSKD, v_BSKD, **masks)
  return xla.attend(q_BLND, k_BSKD, v_BSKD, dropout=dropout, chunk=chunk, **masks)


def _cudnn(q_BLND: jax.Array, k_BSKD: jax.Array, v_BSKD: jax.Array, *, causal: bool,
           kv_lengths_B: jax.Array | None, q_segments_BL: jax.Array | None,
           kv_segments_BS: jax.Array | None, bias: jax.Array | None) -> jax.Array:
  """cuDNN's fused attention: right padding as sequence lengths (cuDNN skips the padded
  blocks), causal as its causal mask; packed segments as a boolean mask, which JAX hands
  cuDNN as a bias."""
  segments = allowed_mask(q_BLND.shape[1], k_BSKD.shape[1], q_segments_BL=q_segments_BL,
                          kv_segments_BS=kv_segments_BS)
  lengths = None if kv_lengths_B is None else kv_lengths_B.astype(jnp.int32)
  return jax.nn.dot_product_attention(q_BLND, k_BSKD, v_BSKD, bias=bias, mask=segments,
                                      is_causal=causal, key_value_seq_lengths=lengths,
                                      implementation="cudnn")


