"""How much of a synth run's answers repeat themselves (greedy loops of a small target).

    .venv/bin/python benchmarks/synth_repetition.py results/gpu-quality/synth/synth.jsonl.zst \
        --out benchmarks/results/quality_vs_data/synth_repetition_gpu_quality.json

A synth journal (results/<run>/synth/.partial/journal.jsonl, what a GPU host run copies
off) is read the same way: its answered entries are the records.

A drafter predicts a looping answer almost perfectly, so the share of completion tokens that
continue an n-gram already seen earlier in the same answer bounds how much of a high
validation accuracy (and predicted acceptance length) comes from loops rather than from
language. Reports, per n: the share of such tokens over all completion tokens, and the share
of answers that stopped at max_tokens; per --cut n: what prepare's ``cut_loops: n`` would cut
(the answers it shortens and the completion tokens it drops, prepare.loop_start).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from eagle3_lab.results import write_result
from eagle3_pipeline.prepare import loop_start
from eagle3_pipeline.runtime.files import iter_jsonl


def repeated_tokens(ids: list[int], n: int) -> int:
    """Tokens that end an n-gram which already occurred earlier in ``ids``."""
    seen: set[tuple[int, ...]] = set()
    hits = 0
    for i in range(n, len(ids) + 1):
        gram = tuple(ids[i - n : i])
        if gram in seen:
            hits += 1
        seen.add(gram)
    return hits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", help="a synth stage output (synth.jsonl.zst) or its journal")
    ap.add_argument("--n", type=int, nargs="+", default=[4, 8, 16, 32])
    ap.add_argument("--cut", type=int, nargs="*", default=[16, 32], help="cut_loops values")
    ap.add_argument("--out")
    args = ap.parse_args()
    total, answers, at_limit = 0, 0, 0
    hits = dict.fromkeys(args.n, 0)
    cut_rows, cut_tokens = dict.fromkeys(args.cut, 0), dict.fromkeys(args.cut, 0)
    for rec in iter_jsonl(args.records):
        if rec.get("status", "ok") != "ok":  # a journal's rejected or failed request
            continue
        ids = rec["completion_token_ids"]
        answers += 1
        total += len(ids)
        at_limit += rec.get("finish_reason") == "length"
        for n in args.n:
            hits[n] += repeated_tokens(ids, n)
        for n in args.cut:
            start = loop_start(ids, n)
            if start is not None:
                cut_rows[n] += 1
                cut_tokens[n] += len(ids) - start
    partial = Path(args.records).parent.name == ".partial"
    result = {
        # <run>/synth/<file> (<run>/synth/.partial/journal.jsonl)
        "records": "/".join(Path(args.records).parts[-4 if partial else -3 :]),
        "answers": answers,
        "completion_tokens": total,
        "stopped_at_max_tokens": at_limit / answers,
        "repeated_ngram_token_share": {str(n): hits[n] / total for n in args.n},
        "cut_loops": {
            str(n): {"answers_cut": cut_rows[n] / answers, "tokens_cut": cut_tokens[n] / total}
            for n in args.cut
        },
    }
    print(json.dumps(result, indent=2))
    if args.out:
        write_result(args.out, result)


if __name__ == "__main__":
    main()
