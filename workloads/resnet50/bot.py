"""The Bottleneck Transformer block of BoTNet (Srinivas, Lin, Parmar, Shlens, Abbeel,
Vaswani, "Bottleneck Transformers for Visual Recognition", CVPR 2021, arXiv:2101.11605).

BoT50 is ResNet-50 with the 3x3 convolution of each of the last stage's three blocks
replaced by multi-head self-attention over all positions of the feature map, with 2-D
relative position encodings (the paper's Figure 4 and its official TensorFlow code,
github gist aravindsrinivas/56359b79f0ce4449bcb04ab4b56a57a2): 1x1 convolution, BN,
ReLU -> MHSA (4 heads; query, key and value projections without biases; logits
q.k + q.r_h + q.r_w with a learned embedding per relative row and column offset) ->
2x2 average pooling in the first block, whose stride the 3x3 convolution carried -> BN,
ReLU -> 1x1 convolution, BN with its scale initialised to 0; shortcut and final ReLU as in
ResNet. BoT50 at 224x224 has
20,852,008 parameters (the paper: 20.8 M), against ResNet-50's 25,557,032.

Shape legend: B batch, H/W spatial (queries), P/Q spatial (keys), N heads, D head width,
C channels.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from mlbench.fields import AttentionImpl
from mlbench.train import attention
from workloads.common.blocks import ResidualBlock, he_normal, shortcut


def relative_logits(q_BNHWD: jax.Array, rel_h: jax.Array, rel_w: jax.Array) -> jax.Array:
  """[B, N, H, W, P, Q]: q(y, x) . r_h[p - y + H - 1] + q(y, x) . r_w[q - x + W - 1], the
  absolute-indexed form of the paper's `relative_logits` (its rel_to_abs)."""
  _, _, h, w, _ = q_BNHWD.shape
  rows_HPD = rel_h[np.arange(h)[None, :] - np.arange(h)[:, None] + h - 1]
  cols_WQD = rel_w[np.arange(w)[None, :] - np.arange(w)[:, None] + w - 1]
  logits_h = jnp.einsum("bnhwd,hpd->bnhwp", q_BNHWD, rows_HPD.astype(q_BNHWD.dtype))
  logits_w = jnp.einsum("bnhwd,wqd->bnhwq", q_BNHWD, cols_WQD.astype(q_BNHWD.dtype))
  return logits_h[..., :, None] + logits_w[..., None, :]


class RelativeSelfAttention(nn.Module):
  """All-to-all MHSA over an H x W map with 2-D relative position logits: the positions
  as a sequence of H x W tokens, the relative logits as the bias of the harness's
  attention entry point (`mlbench.train.attention`; at 224x224 the 14x14 and 7x7 maps are
  below the TPU kernels' 128-token blocks, so XLA's attention)."""

  heads: int
  dtype: jnp.dtype = jnp.float32
  implementation: AttentionImpl = AttentionImpl.AUTO

  @nn.compact
  def __call__(self, x_BHWC: jax.Array) -> jax.Array:
    b, h, w, c = x_BHWC.shape
    d = c // self.heads
    proj = functools.partial(nn.DenseGeneral, features=(self.heads, d), use_bias=False,
                             kernel_init=nn.initializers.normal(0.01), dtype=self.dtype)
    q, k, v = (proj(name=n)(x_BHWC).reshape(b, h * w, self.heads, d)
               for n in ("query", "key", "value"))
    emb = nn.initializers.normal(d ** -0.5)
    rel_h = self.param("rel_height", emb, (2 * h - 1, d))
    rel_w = self.param("rel_width", emb, (2 * w - 1, d))
    # The relative logits of the scaled query, as the paper adds them to q.k / sqrt(d).
    q_BHWND = (q * jnp.asarray(d ** -0.5, q.dtype)).reshape(b, h, w, self.heads, d)
    bias_BNLS = relative_logits(q_BHWND.transpose(0, 3, 1, 2, 4), rel_h, rel_w).reshape(
        b, self.heads, h * w, h * w).astype(jnp.float32)
    out_BLND = attention.attend(q, k, v, name="relative self-attention",
                                implementation=self.implementation, bias=bias_BNLS)
    return out_BLND.reshape(b, h, w, c)


class BoTBlock(ResidualBlock):
  """A ResNet bottleneck whose 3x3 convolution is `RelativeSelfAttention`."""

  @nn.compact
  def __call__(self, x_BHWC: jax.Array, train: bool) -> jax.Array:
    dtype = jnp.dtype(self.cfg.dtype.value)
    conv, norm = self.conv_and_norm(train, he_normal)  # the ResNet's convolutions'
    y = nn.relu(norm(name="bn1")(conv(self.width, (1, 1), name="conv1")(x_BHWC)))
    y = RelativeSelfAttention(self.cfg.attention_heads, dtype, self.cfg.attention,
                              name="mhsa")(y)
    if self.strides != 1:  # TF's 'same' average pooling, as the projection's output size
      y = nn.avg_pool(y, (self.strides, self.strides), strides=(self.strides, self.strides),
                      padding="SAME", count_include_pad=False)
    y = nn.relu(norm(name="bn2")(y))
    # The last BN's scale starts at 0, whatever zero_init_last_bn says for the ResNet
    # blocks: the reference's bot_block ends in batch_norm_relu(..., init_zero=True)
    # (the gist's botnet.py; in its PyTorch port, BotBlock.conv3's BNReLU(init_zero=True)).
    y = norm(scale_init=nn.initializers.zeros, name="bn3")(
        conv(4 * self.width, (1, 1), name="conv3")(y))
    return nn.relu(y + shortcut(x_BHWC, 4 * self.width, self.strides, conv, norm))


def mhsa_flops(size: int, channels: int) -> float:
  """Forward FLOPs of `RelativeSelfAttention` on a size x size map of `channels`: the
  query, key and value projections, q.k and the weighted values over all size^2 x size^2
  position pairs, and the row and column relative logits."""
  n = size * size
  return float(3 * 2 * n * channels * channels + 2 * 2 * n * n * channels
               + 2 * 2 * n * size * channels)
