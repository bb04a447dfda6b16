"""The target's shape and weight size from its config.json, without loading it.

Planning (``plan``) runs when Snakemake parses the workflow, before the target job: it reads
config.json from the model directory, the Hugging Face cache (hub ids) or, for the packaged
model, its known shape. Weight bytes come from the weight files, else the safetensors index,
else an estimate from the config (parameter counts, with the quantization it declares).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..target import default_layer_ids
from ..target.model_dir import SMOLLM2_135M

# the packaged target's shape before the target job has written its config.json
PACKAGED_CONFIG = SMOLLM2_135M
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


class TargetNotFound(RuntimeError):
    """The target's config.json cannot be read before the run (hub id neither cached nor
    reachable); the message says what to do."""


def _hub_config(params: dict) -> tuple[dict, str, int | None]:
    """config.json of a hub id from the local HF cache, else from the hub (unless offline);
    with the safetensors index's total size when that file is cached or reachable too."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    repo, rev = params["path"], params.get("revision")
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    cached = try_to_load_from_cache(repo, "config.json", revision=rev)
    if isinstance(cached, str):
        path, where = cached, f"HF cache ({repo})"
    elif offline:
        raise TargetNotFound(
            f"target.path {repo!r} (target.source: hub) is not in the local Hugging Face cache "
            "and HF_HUB_OFFLINE=1 forbids downloading it: download it first (`hf download "
            f"{repo}`), unset HF_HUB_OFFLINE, or set target.source: local and target.path to "
            "a model directory"
        )
    else:
        try:
            path = hf_hub_download(repo, "config.json", revision=rev)
        except Exception as err:  # any failure means: not reachable now
            raise TargetNotFound(
                f"target.path {repo!r} (target.source: hub): the hub cannot be reached and the "
                f"model is not in the local Hugging Face cache ({type(err).__name__}: "
                f"{str(err)[:200]}); download it where there is internet (`hf download {repo}`)"
            ) from None
        where = f"hub ({repo})"
    index = try_to_load_from_cache(repo, "model.safetensors.index.json", revision=rev)
    total = None
    if isinstance(index, str):
        total = json.loads(Path(index).read_text()).get("metadata", {}).get("total_size")
    return json.loads(Path(path).read_text()), where, total


def read_config(params: dict, run_dir: Path) -> tuple[dict, str, Path | None, int | None]:
    """(config.json, where it was read, the local model dir or None, index total size)."""
    source = params["source"]
    if source == "packaged":
        materialized = run_dir / "target" / "model" / "config.json"
        if materialized.is_file():
            return json.loads(materialized.read_text()), str(materialized), None, None
        cfg = dict(PACKAGED_CONFIG, torch_dtype=params.get("dtype") or "bfloat16")
        return cfg, "packaged SmolLM2-135M-Instruct (known shape)", None, None
    if source == "local":
        d = Path(params["path"]).expanduser()
        return json.loads((d / "config.json").read_text()), str(d / "config.json"), d, None
    cfg, where, total = _hub_config(params)
    return cfg, where, None, total


def text_config(cfg: dict) -> dict:
    """The language model's part of a multimodal config (Kimi-K2.5: text_config)."""
    return cfg.get("text_config") or cfg


def param_counts(t: dict) -> dict[str, int]:
    """Parameters of a decoder-only text model by kind, from its config: dense or MoE MLPs,
    grouped-query or multi-head latent attention (MLA: DeepSeek-V3, Kimi-K2)."""
    h, n, vocab = t["hidden_size"], t["num_hidden_layers"], t["vocab_size"]
    heads = t["num_attention_heads"]
    kv = t.get("num_key_value_heads") or heads
    hd = t.get("head_dim") or h // heads
    if t.get("kv_lora_rank"):
        nope, rope, v = t["qk_nope_head_dim"], t["qk_rope_head_dim"], t["v_head_dim"]
        q_lora = t.get("q_lora_rank")
        q = h * q_lora + q_lora * heads * (nope + rope) if q_lora else h * heads * (nope + rope)
        kv_p = h * (t["kv_lora_rank"] + rope) + t["kv_lora_rank"] * heads * (nope + v)
        attn = q + kv_p + heads * v * h
    else:
        attn = 2 * h * heads * hd + 2 * h * kv * hd
    experts = t.get("n_routed_experts") or t.get("num_local_experts") or t.get("num_experts") or 0
    moe_layers = 0
    if experts:
        moe_layers = n - int(t.get("first_k_dense_replace") or 0)
    dense_layers = n - moe_layers
    inter = t.get("intermediate_size") or 4 * h
    moe_inter = t.get("moe_intermediate_size") or inter
    routed = moe_layers * experts * 3 * h * moe_inter
    per_tok = t.get("num_experts_per_tok") or 0
    shared = moe_layers * (int(t.get("n_shared_experts") or 0) * 3 * h * moe_inter + h * experts)
    embed = vocab * h * (1 if t.get("tie_word_embeddings") else 2)
    rest = n * attn + dense_layers * 3 * h * inter + shared
    return {
        "routed_experts": routed,
        "linear": rest,  # attention, dense and shared MLPs, routers
        "embeddings": embed,
        "total": routed + rest + embed,
        "active": rest + embed + (routed * per_tok // experts if experts else 0),
    }


def _quant_bytes_per_param(q: dict) -> tuple[float, bool] | None:
    """(bytes per quantized weight, whether only routed experts are quantized), or None."""
    method = q.get("quant_method")
    if method == "fp8":
        return 1.0, False
    if method == "compressed-tensors":
        groups = [g.get("weights") or {} for g in (q.get("config_groups") or {}).values()]
        w = next((g for g in groups if g.get("num_bits")), None)
        if not w:
            return None
        scale = 2 / w["group_size"] if w.get("group_size") else 0  # a bf16 scale per group
        ignore = " ".join(q.get("ignore") or [])
        experts_only = "self_attn" in ignore or "shared_experts" in ignore
        return w["num_bits"] / 8 + scale, experts_only
    bits = q.get("bits") or q.get("w_bit")
    if bits:  # GPTQ / AWQ style
        return bits / 8 + 2 / (q.get("group_size") or q.get("q_group_size") or 128), False
    return None


def estimated_weight_bytes(cfg: dict, dtype: str | None = None) -> int:
    """Weight bytes of the checkpoint from config.json alone: parameters times the bytes of
    their dtype, quantized layers (config.json's quantization_config) at their bit width."""
    t = text_config(cfg)
    p = param_counts(t)
    dtype = dtype or str(cfg.get("torch_dtype") or t.get("torch_dtype") or "bfloat16")
    base = DTYPE_BYTES.get(dtype.replace("torch.", ""), 2)
    q = cfg.get("quantization_config") or t.get("quantization_config")
    quant = _quant_bytes_per_param(q) if q else None
    if not quant:
        return int(p["total"] * base)
    qb, experts_only = quant
    quantized = p["routed_experts"] + (0 if experts_only else p["linear"])
    return int(quantized * qb + (p["total"] - quantized) * base)


def weight_bytes(cfg: dict, model_dir: Path | None, index_total: int | None, dtype=None):
    """(bytes, how they were found): the weight files, the safetensors index, or config.json."""
    if model_dir is not None:
        files = [p for p in model_dir.glob("*.safetensors") if p.is_file()]
        if files:
            return sum(p.stat().st_size for p in files), "weight files"
        index = model_dir / "model.safetensors.index.json"
        if index.is_file():
            total = json.loads(index.read_text()).get("metadata", {}).get("total_size")
            if total:
                return int(total), "model.safetensors.index.json"
    if index_total:
        return int(index_total), "model.safetensors.index.json"
    return estimated_weight_bytes(cfg, dtype), "estimate from config.json"


def shape(cfg: dict) -> dict[str, Any]:
    """The facts the plan shows, in target.json's ``architecture`` names."""
    t = text_config(cfg)
    n = int(t["num_hidden_layers"])
    p = param_counts(t)
    q = cfg.get("quantization_config") or t.get("quantization_config") or {}
    return {
        "architectures": cfg.get("architectures"),
        "model_type": t.get("model_type") or cfg.get("model_type"),
        "num_layers": n,
        "hidden_size": int(t["hidden_size"]),
        "vocab_size": int(t["vocab_size"]),
        "num_attention_heads": int(t["num_attention_heads"]),
        "attention": "MLA" if t.get("kv_lora_rank") else "GQA/MHA",
        "experts": t.get("n_routed_experts") or t.get("num_local_experts") or None,
        "quantization": q.get("quant_method"),
        "params_total": p["total"],
        "params_active": p["active"],
        "default_layer_ids": default_layer_ids(n),
    }
