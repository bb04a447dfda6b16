"""Writing the miniature's checkpoint in Kimi-K2.5's own tensor names.

transformers 5 holds a DeepSeek-V3 layer's routed experts as two fused tensors
(``experts.gate_up_proj`` [E, 2I, H], ``experts.down_proj`` [E, H, I]); Kimi-K2.5's checkpoint,
which vLLM reads, has one Linear per expert (``experts.{e}.gate_proj`` ...), the text model
under ``language_model.`` and the vision side as ``vision_tower.*`` and ``mm_projector.*``.
transformers' own save of a ``kimi_k25`` model does not write those names back (its reverse
rename gives ``language_model.model.blocks.N``), so the names are written here.
"""

from __future__ import annotations

import importlib.metadata as md
import json
from pathlib import Path

from ..hidden_states.checks import fuse_experts
from . import config as cfg
from .quantize import dequantize_tensor


def text_tensors(state: dict, dtype) -> dict:
    """Kimi/DeepSeek-V3 checkpoint tensors of a transformers ``DeepseekV3ForCausalLM`` state
    dict (fused experts split per expert), in ``dtype`` except the router's correction bias,
    which stays float32 as in DeepSeek-V3's checkpoints."""
    import torch

    out = {}
    for name, t in state.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            width = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :width]
                out[f"{base}{e}.up_proj.weight"] = t[e, width:]
        elif name.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e]
        else:
            out[name] = t
    return {
        k: (v.to(torch.float32) if k.endswith("e_score_correction_bias") else v.to(dtype))
        .contiguous()
        .clone()
        for k, v in out.items()
    }


def vision_tensors(seed: int, dtype) -> dict:
    """A one-layer MoonViT and its patch-merger projector, random (std 0.02, LayerNorms at 1
    and 0), in the names of Kimi-K2.5's checkpoint. The miniature never sees an image: these
    exist so the ``kimi_k25`` checkpoint is complete when served with images enabled."""
    import torch

    g = torch.Generator().manual_seed(seed)
    h, w, n = cfg.VISION_HIDDEN, cfg.VISION_WIDTH, cfg.VISION_POS_EMB
    merged = h * 4  # 2 x 2 patch merge

    def rnd(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(dtype)

    def norm(prefix):
        return {
            f"{prefix}.weight": torch.ones(h, dtype=dtype),
            f"{prefix}.bias": torch.zeros(h, dtype=dtype),
        }

    t = {
        "vision_tower.patch_embed.proj.weight": rnd(h, 3, 14, 14),
        "vision_tower.patch_embed.proj.bias": rnd(h),
        "vision_tower.patch_embed.pos_emb.weight": rnd(n, n, h),
        **norm("vision_tower.encoder.final_layernorm"),
        **norm("mm_projector.pre_norm"),
        "mm_projector.proj.0.weight": rnd(merged, merged),
        "mm_projector.proj.0.bias": rnd(merged),
        "mm_projector.proj.2.weight": rnd(cfg.HIDDEN, merged),
        "mm_projector.proj.2.bias": rnd(cfg.HIDDEN),
    }
    for i in range(cfg.VISION_LAYERS):
        b = f"vision_tower.encoder.blocks.{i}"
        t.update(norm(f"{b}.norm0"))
        t.update(norm(f"{b}.norm1"))
        t.update(
            {
                f"{b}.wqkv.weight": rnd(3 * h, h),
                f"{b}.wqkv.bias": rnd(3 * h),
                f"{b}.wo.weight": rnd(h, h),
                f"{b}.wo.bias": rnd(h),
                f"{b}.mlp.fc0.weight": rnd(w, h),
                f"{b}.mlp.fc0.bias": rnd(w),
                f"{b}.mlp.fc1.weight": rnd(h, w),
                f"{b}.mlp.fc1.bias": rnd(h),
            }
        )
    return t


def silence_unwritten_ids(text: dict, rows: list) -> dict:
    """``text`` with the lm_head row of every id that occurs in the training prompts but never
    in a completion (the template's markers, the ``<think>`` the generation prompt opens) set
    to the row every id outside the rows has: training never asked the model to write them,
    so it must not write them more often than any unused id. Sampled at temperature 1, a model
    without this wrote a second ``<think>`` into a few answers."""
    head = text["lm_head.weight"].clone()
    used = {i for p, c in rows for i in (*p, *c)}
    written = {i for _, c in rows for i in c}
    outside = next(i for i in range(head.shape[0]) if i not in used)
    for i in used - written:
        head[i] = head[outside]
    return {**text, "lm_head.weight": head}


def checkpoint_tensors(text: dict, wrapper: bool, seed: int, dtype) -> dict:
    """All tensors of the model directory: the text model's under ``language_model.`` plus the
    vision side for the wrapper, as they are for the backbone alone."""
    if not wrapper:
        return dict(text)
    out = {f"language_model.{k}": v for k, v in text.items()}
    out.update(vision_tensors(seed, dtype))
    return out


def write_model_dir(out_dir: Path, tensors: dict, wrapper: bool, quantized: bool) -> None:
    """model.safetensors, config.json and generation_config.json (the tokenizer's files are
    written by :mod:`.tokenizer`)."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    ordered = {k: tensors[k] for k in sorted(tensors)}
    save_file(ordered, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    conf = cfg.model_config(wrapper=wrapper, quantized=quantized)
    # without it transformers takes a local tokenizer for a Mistral one and warns about its regex
    conf["transformers_version"] = md.version("transformers")
    (out_dir / "config.json").write_text(json.dumps(conf, indent=2) + "\n")
    (out_dir / "generation_config.json").write_text(
        json.dumps(cfg.generation_config(), indent=2) + "\n"
    )
    if wrapper:
        (out_dir / "preprocessor_config.json").write_text(
            json.dumps({"media_proc_cfg": cfg.MEDIA_PROC_CFG}, indent=2) + "\n"
        )


def load_text_model(model_dir: Path, dtype=None):
    """transformers' ``DeepseekV3ForCausalLM`` with the text model of a built directory (either
    variant; W4A16 experts dequantized, as the int4 kernels compute with them): the reference
    a server's outputs are compared with."""
    import torch
    from safetensors.torch import load_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    dtype = dtype or torch.float32
    tensors = load_file(str(Path(model_dir) / "model.safetensors"))
    if any(k.startswith("language_model.") for k in tensors):
        tensors = {
            k[len("language_model.") :]: v
            for k, v in tensors.items()
            if k.startswith("language_model.")
        }
    packed = sorted(k[: -len(".weight_packed")] for k in tensors if k.endswith(".weight_packed"))
    if packed:
        for base in packed:
            parts = {p: tensors.pop(f"{base}.weight_{p}") for p in ("packed", "scale", "shape")}
            tensors[f"{base}.weight"] = dequantize_tensor(
                {f"weight_{p}": t for p, t in parts.items()}
            )
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**cfg.text_config(training=True)))
    tensors = fuse_experts(tensors, model.state_dict().keys())
    model.load_state_dict({k: v.to(torch.float32) for k, v in tensors.items()}, strict=True)
    return model.to(dtype).eval()
