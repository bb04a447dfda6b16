"""Routed experts to compressed-tensors W4A16, the format Kimi-K2.5 ships its experts in.

Every routed expert's gate/up/down Linear becomes ``weight_packed`` (int32, eight 4-bit values
each), ``weight_scale`` (bf16, one per group of 32 inputs) and ``weight_shape``: symmetric int4,
scale = max |w| of the group / 7.5 (compressed-tensors' min-max rule for a signed 4-bit range),
packed by compressed-tensors' own ``PackedQuantizationCompressor`` (format ``pack-quantized``).
Attention, shared experts, the dense first layer, the router, embeddings and lm_head stay bf16,
as in Kimi-K2.5; ``config.quantization_config`` lists them as ignored.
"""

from __future__ import annotations

import re

from ..hidden_states.checks import unpack_linear
from . import config as cfg

ROUTED_EXPERT = re.compile(r"mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")


def scheme():
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    return QuantizationScheme(
        targets=["Linear"],
        weights=QuantizationArgs(
            num_bits=4,
            type="int",
            strategy="group",
            group_size=cfg.GROUP_SIZE,
            symmetric=True,
            dynamic=False,
        ),
    )


def quantize_tensor(weight, sch=None) -> dict:
    """The compressed tensors (``weight_packed``, ``weight_scale``, ``weight_shape``) of one
    Linear weight [out, in]."""
    import torch
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization.utils import calculate_qparams

    sch = sch or scheme()
    w = weight.to(torch.float32)
    out_f, in_f = w.shape
    if in_f % cfg.GROUP_SIZE:
        raise ValueError(f"input size {in_f} is not a multiple of the group size {cfg.GROUP_SIZE}")
    groups = w.reshape(out_f, in_f // cfg.GROUP_SIZE, cfg.GROUP_SIZE)
    scale, zero = calculate_qparams(groups.amin(-1), groups.amax(-1), sch.weights)
    # the scale is stored in bf16: quantize with the rounded value the server will use
    scale = scale.to(torch.bfloat16).to(torch.float32)
    packed = PackedQuantizationCompressor.compress(
        {"weight": w, "weight_scale": scale, "weight_zero_point": zero}, sch
    )
    packed["weight_scale"] = packed["weight_scale"].to(torch.bfloat16)
    return packed


def dequantize_tensor(packed: dict):
    """The float32 weight a W4A16 kernel computes with (for checks)."""
    return unpack_linear(packed, scheme())


def quantize_experts(tensors: dict) -> tuple[dict, dict]:
    """``tensors`` with every routed expert Linear replaced by its W4A16 tensors, and figures:
    how many were quantized and their relative error (Frobenius norm of w - dequant(w) over
    that of w, worst and mean)."""
    import torch

    sch = scheme()
    out, errors = {}, []
    for name, t in tensors.items():
        if not ROUTED_EXPERT.search(name):
            out[name] = t
            continue
        packed = quantize_tensor(t, sch)
        base = name[: -len("weight")]
        for key, value in packed.items():
            out[base + key] = value.contiguous()
        w = t.to(torch.float32)
        errors.append(float((w - dequantize_tensor(packed)).norm() / w.norm().clamp_min(1e-12)))
    if not errors:
        raise ValueError("no routed expert weights found to quantize")
    return out, {
        "quantized_linears": len(errors),
        "rel_error_max": max(errors),
        "rel_error_mean": sum(errors) / len(errors),
    }
