"""Whether cuDNN's fused attention takes a call: jax's own checks, asked before tracing.

`jax.nn.dot_product_attention(implementation="cudnn")` checks each call as it traces it
(jax/_src/cudnn/fused_attention_stablehlo.py: `check_layout`, then
`check_is_flash_attention`): the inputs' dtypes, the bias's sequence dimensions, the head
sizes the GPU generation allows (up to 256 from Hopper on, else 128, multiples of 8), even
sequence lengths when training with a bias (BoT50's 7x7 maps are 49 tokens), packed and
latent layouts only from Hopper on. It raises there, inside a train step's trace: a
traceback where the choice should have been XLA's. `refusal` asks the same functions
first, from the call's shapes alone, so the choice follows the jax installed; off a GPU
they answer for a GPU before Hopper (their compute capability checks find no CUDA device).

A bias's dtype jax does not check: XLA's cuDNN attention takes a bias in the inputs' dtype
or in float32 (openxla/xla#32985, which fixed float32 biases giving NaN gradients,
jax-ml/jax#32242), so another dtype is refused here.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def _version() -> int | str:
  """The cuDNN version jax finds, or why there is none where there must be one (a GPU
  backend); 0 off a GPU, where jax's checks consult it for no device."""
  from jax._src.cudnn import fused_attention_stablehlo as fa

  try:
    return int(fa.check_cudnn_version())
  except RuntimeError as e:  # jax's "cuDNN is not detected."
    return str(e) if jax.default_backend() == "gpu" else 0


def refusal(site: Any) -> str:
  """Why cuDNN's fused attention cannot serve an `attention.Site` ("" when it can), in
  jax's words."""
  from jax._src.cudnn import fused_attention_stablehlo as fa

  if site.bias and site.bias_dtype not in ("", site.dtype, "float32"):
    return (f"a {site.bias_dtype} bias; cuDNN takes one in float32 or the inputs' "
            f"{site.dtype}")
  version = _version()
  if isinstance(version, str):
    return version
  dtype = jnp.dtype(site.dtype)
  q = jax.ShapeDtypeStruct((site.batch, site.q_len, site.heads, site.head_dim), dtype)
  kv = jax.ShapeDtypeStruct((site.batch, site.kv_len, site.kv_heads, site.head_dim), dtype)
  # Packed segments reach cuDNN as a mask, which jax adds to the bias: [B, 1, L, S].
  bias = (jax.ShapeDtypeStruct((1, 1, site.q_len, site.kv_len), site.bias_dtype or dtype)
          if site.bias or site.packed else None)
  try:
    fa.check_layout(q, kv, kv, bias, None, None, None, None, None, None,
                    fa.AttentionLayout.BTNH)
    fa.check_is_flash_attention(q, kv, kv, fa.AttentionLayout.BTNH.value, version,
                                bias is not None, site.training)
  except (ValueError, NotImplementedError) as e:
    return f"jax's cuDNN check refuses it{' in training' if site.training else ''}: {e}"
  return ""
