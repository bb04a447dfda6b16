"""The extract stage's reference forward at a real 8B shape (random weights) on a GPU.

    python benchmarks/reference_forward.py --seq 2048

Builds a Llama-3-8B-shaped model with random weights (no download), captures hidden states
exactly as the extract stage's reference check does (``verify.reference_hidden_states``: aux
layers from HF's hidden_states, the final layer before the norm), and reports the forward time
in float32 and bfloat16 and the relative error of bf16 against float32 per layer: the error a
bf16 server shows against the float32 reference, i.e. where the extract stage's threshold
(``extract.max_reference_rel_error``, default 0.05) must sit.
"""

from __future__ import annotations

import argparse
import time

from eagle3_lab.results import write_result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--out")
    args = ap.parse_args()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from eagle3_pipeline.hidden_states.checks import reference_hidden_states
    from eagle3_pipeline.target import default_layer_ids

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = LlamaConfig(
        hidden_size=args.hidden,
        intermediate_size=int(args.hidden * 3.5),
        num_hidden_layers=args.layers,
        num_attention_heads=max(8, args.hidden // 128),
        num_key_value_heads=8,
        vocab_size=128256,
        rms_norm_eps=1e-5,
        max_position_embeddings=8192,
        rope_theta=500000.0,
    )
    torch.manual_seed(0)
    with torch.device(dev):
        model = LlamaForCausalLM(cfg).float().eval()
    ids = torch.randint(0, cfg.vocab_size, (args.seq,)).tolist()
    layer_ids = [*default_layer_ids(args.layers), args.layers]
    results = {
        "shape": {"hidden": args.hidden, "layers": args.layers, "seq": args.seq},
        "layer_ids": layer_ids,
        "device": dev,
    }
    outs = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = model.to(dtype)
        reference_hidden_states(model, ids[:64], layer_ids)  # warm-up
        if dev == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        outs[dtype] = [h.float() for h in reference_hidden_states(model, ids, layer_ids)]
        if dev == "cuda":
            torch.cuda.synchronize()
        name = str(dtype).split(".")[-1]
        results[f"{name}_forward_s"] = time.perf_counter() - t0
        if dev == "cuda":
            results[f"{name}_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        print(
            f"{name}: forward {results[f'{name}_forward_s']:.3f} s for {args.seq} tokens",
            flush=True,
        )
    results["bf16_vs_fp32_rel_error"] = {
        str(layer): float((b - a).norm() / a.norm())
        for layer, a, b in zip(layer_ids, outs[torch.float32], outs[torch.bfloat16], strict=True)
    }
    print(
        "bf16 vs float32 relative error per layer:",
        {k: round(v, 4) for k, v in results["bf16_vs_fp32_rel_error"].items()},
    )
    if args.out:
        write_result(args.out, results)


if __name__ == "__main__":
    main()
