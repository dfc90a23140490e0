"""What a model costs: parameters, and FLOPs per forward pass.

FLOPs count 2 per multiply-add and include the attention itself. They are measured with
``torch.utils.flop_counter`` on a real forward pass, adding formulas for the operators it does not see
(the fused CPU SDPA kernel); SSOG layers are counted on the PyTorch path, whose GEMMs do the same multiply-adds
as the fused C kernels, which the counter cannot see. Elementwise work (softmax, the Gaussians) is not counted,
as in the SSOG post.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop

from ssog_core.nn.attention import SSOGAttention


def count_params(model: nn.Module) -> int:
    """All parameters, frozen ones included; buffers are not parameters."""
    return sum(p.numel() for p in model.parameters())


def _cpu_sdpa_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop(query_shape, key_shape, value_shape)


# Operators the flop counter has no formula for; each key maps to a formula over input shapes.
_EXTRA_FORMULAS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flop}


def count_flops(model: nn.Module, img_size: tuple[int, int] | None = None, batch: int = 1) -> int:
    """FLOPs of one forward pass of ``model`` on ``batch`` images (of ``img_size``, default the training size)."""
    cfg = model.config
    h, w = img_size or cfg.img_size
    img = torch.rand(batch, cfg.in_chans, h, w, device=next(model.parameters()).device)
    was_training = model.training
    ssog = [m for m in model.modules() if isinstance(m, SSOGAttention)]
    backends = [m.backend for m in ssog]
    model.eval()
    try:
        for m in ssog:
            m.backend = "torch"
        with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=_EXTRA_FORMULAS) as counter:
            model(img)
    finally:
        model.train(was_training)
        for m, backend in zip(ssog, backends, strict=True):
            m.backend = backend
    return counter.get_total_flops()
