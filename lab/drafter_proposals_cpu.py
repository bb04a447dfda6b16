"""Where vLLM's drafter proposes otherwise than the replay: every decoding step compared.

    .venv/bin/python lab/drafter_proposals_cpu.py \\
        --run /tmp/drafter-replay/gpu-methods-blocks/results/gpu-methods-blocks \\
        --drafter dflash --k 3 --set mtbench --n 12 \\
        --out benchmarks/results/methods/gpu-methods-blocks_cpu_proposals.json

The counters of a prompt set say only whether replay and served agree in sum. This serves the
first ``--n`` prompts of a set one at a time on vLLM's offline engine with the drafter's
``propose`` recorded (``eagle3_lab.diagnostics.served.served_proposals``, what
tests/test_replay.py checks with tiny drafters) and compares, request by request, vLLM's
spec-decode counters with the walk and, step by step, vLLM's proposals with the replay's (the k
+ 1 queries vLLM builds for DFlash): for every proposal that differs, the first slot that
differs, the replay's margin there (top-1 minus top-2 logit: how close to a tie) and which of
the two was the target's token. ``--run``: a run directory as lab/drafter_replay_cpu.py leaves
it (prompts, baseline, the local drafter copies and target.json)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from eagle3_lab import diagnostics as R
from eagle3_lab.diagnostics import models
from eagle3_lab.diagnostics import served as vllm_served
from eagle3_lab.results import write_result
from eagle3_pipeline.runtime import setup_logging
from eagle3_pipeline.runtime.files import iter_jsonl, read_json
from eagle3_pipeline.runtime.provenance import package_versions


def differences(served, props, margins, outputs, k):
    """Every served proposal that is not the replay's at the same anchor (anchors as the walk
    moves, like replay.compare_proposals)."""
    out, i = [], 0
    for _, drafts in served:
        if i >= len(outputs):
            break
        d, r = list(drafts)[:k], list(props[i])[:k]
        if d != r:
            j = next(j for j in range(k) if d[j] != r[j])
            truth = outputs[i + 1 + j] if i + 1 + j < len(outputs) else None
            out.append(
                {
                    "anchor": i,
                    "slot": j,
                    "margin": margins[i][j],
                    "served_right": d[j] == truth,
                    "replay_right": r[j] == truth,
                    "earlier_slots_right": d[:j] == list(outputs[i + 1 : i + 1 + j]),
                }
            )
        a = 0
        while a < k and i + 1 + a < len(outputs) and d[a] == outputs[i + 1 + a]:
            a += 1
        i += a + 1
    return out


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True)
    ap.add_argument("--drafter", required=True, help="a drafter/<name> of the run")
    ap.add_argument("--k", type=int, required=True)
    ap.add_argument("--set", default="mtbench")
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--out")
    args = ap.parse_args()
    setup_logging(None)
    run = Path(args.run)
    drafter_dir = run / "drafter" / args.drafter
    target_dir = read_json(run / "target" / "target.json")["model_path"]
    config = read_json(drafter_dir / "config.json")
    method = config["speculators_model_type"]
    layers = config[
        "aux_hidden_state_layer_ids" if method == "dflash" else "eagle_aux_hidden_state_layer_ids"
    ]
    rows = list(iter_jsonl(run / "prompts" / f"bench_{args.set}.jsonl"))[: args.n]
    baseline = read_json(run / "bench" / "baseline.json")["sets"][args.set]["runs"][0]["outputs"]

    t0 = time.monotonic()
    work = Path(f"/tmp/drafter-proposals/{args.drafter}-k{args.k}")
    work.mkdir(parents=True, exist_ok=True)
    served = vllm_served.served_proposals(
        target_dir,
        drafter_dir,
        method,
        args.k,
        [r["messages"] for r in rows],
        args.max_tokens,
        work / "served.json",
        log_path=work / "vllm.log",
        cache_root=work / "vllm-cache",
    )
    served_s = time.monotonic() - t0
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    drafter, _ = models.load_drafter(drafter_dir, target_dir)
    block = args.k + 1 if method == "dflash" else None
    requests, diffs = [], []
    for index, (row, req) in enumerate(zip(rows, served["requests"], strict=True)):
        prompt = models.prompt_ids(tokenizer, row["messages"])
        outputs = req["outputs"]
        ids = prompt + outputs
        aux = models.target_states(model, ids, layers).flatten(1)
        props, margins = models.proposals_for(drafter, method, aux, ids, len(prompt), args.k, block)
        cmp = R.compare_proposals(req["proposals"], props, outputs, args.k)
        w = R.walk(props, outputs, args.k, models.greedy_continuation(model, ids, args.k))
        c = req["counters"]
        found = differences(req["proposals"], props, margins, outputs, args.k)
        diffs += found
        requests.append(
            {
                "request": index,
                "prompt_is_the_chat_template's": prompt == req["prompt_token_ids"],
                "outputs_as_baseline": outputs == baseline[index],
                "steps": cmp["steps"],
                "identical": cmp["identical"],
                "anchor_mismatch": cmp["anchor_mismatch"],
                "served": [
                    c["vllm:spec_decode_num_drafts"],
                    c["vllm:spec_decode_num_accepted_tokens"],
                    list(c["vllm:spec_decode_num_accepted_tokens_per_pos"]),
                ],
                "walk": [w["drafts"], w["accepted"], w["accepted_per_pos"]],
                "differing": len(found),
            }
        )
    summary = {
        "requests": len(requests),
        "counters_equal_walk": sum(r["served"] == r["walk"] for r in requests),
        "outputs_as_baseline": sum(r["outputs_as_baseline"] for r in requests),
        "steps": sum(r["steps"] for r in requests),
        "identical": sum(r["identical"] for r in requests),
        "differing": len(diffs),
        "max_margin_where_differing": max((d["margin"] for d in diffs), default=None),
        "differing_with_margin_over_0.05": sum(d["margin"] > 0.05 for d in diffs),
        "served_right": sum(d["served_right"] for d in diffs),
        "replay_right": sum(d["replay_right"] for d in diffs),
        "served_s": round(served_s, 1),
        "elapsed_s": round(time.monotonic() - t0, 1),
    }
    print(summary)
    if args.out:
        out = Path(args.out)
        done = read_json(out) if out.exists() else {"checks": []}
        done["checks"] = [
            c
            for c in done["checks"]
            if (c["drafter"], c["k"], c["set"]) != (args.drafter, args.k, args.set)
        ]
        done["checks"].append(
            {
                "command": " ".join(["python", *sys.argv]),
                "drafter": args.drafter,
                "k": args.k,
                "block": block,
                "set": args.set,
                "max_tokens": args.max_tokens,
                "proposer": served["proposer"],
                "summary": summary,
                "requests": requests,
                "differences": diffs,
                "versions": package_versions(),
            }
        )
        write_result(out, done)


if __name__ == "__main__":
    main()
