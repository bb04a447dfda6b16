#!/usr/bin/env python
"""What the synth stage's bookkeeping costs at scale: the memory and time a synth part takes to
learn which prompts its journals already answer, and the gather to walk every answer, for a
journal of --answers entries shaped like long answers of a large target.

    .venv/bin/python benchmarks/synth_journal_scale.py --answers 100000 \\
        --out benchmarks/results/scale_out/synth_journal_scale.json [--src DIR ...]

Writes (once, then reuses, under --work) a prompt pool and one synth journal of --answers
answers: prompts of --prompt-tokens and answers of --completion-tokens token ids with their
text (about 4 characters a token), keyed as the synth stage keys them. Then, each in a fresh
process (its peak RSS is the process's own), for each --src (a checkout's src directory, to
compare two versions of the code; default this checkout's):

- ``part``: a synth part's start: the journals read, the part's settled prompts found
  (``stage.part_work``), as ``run_part`` does before any request;
- ``gather``: the gather's walk: the journals read, each prompt's answer found
  (``records.outcomes``), then every answer's full entry read in prompt order, as the merged
  records are written (the token-exact check, which needs the target's tokenizer, left out).

Each phase runs --repeats times; the figures are the median wall time and the largest peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from eagle3_lab.results import write_result

REPO = Path(__file__).resolve().parents[1]
FINGERPRINT = "f" * 64
VOCAB = 163840  # Kimi-K2.5's


def make_journal(work: Path, answers: int, prompt_tokens: int, completion_tokens: int) -> dict:
    """The pool and the journal (made once per shape); returns their description."""
    from eagle3_pipeline.synth import answers as answers_lib

    shape = f"{answers}x{prompt_tokens}x{completion_tokens}"
    root = work / shape
    journal = root / "partial" / FINGERPRINT[:16] / answers_lib.part_journal_name(0, 1)
    pool = root / "prompts.jsonl"
    if not journal.exists():
        journal.parent.mkdir(parents=True, exist_ok=True)
        rng = random.Random(0)
        words = ["alpha", "beta", "gamma", "delta", "omega", "theta", "sigma", "kappa"]
        tmp = journal.with_suffix(".tmp")
        with open(pool, "w") as fp, open(tmp, "w") as fj:
            for i in range(answers):
                question = " ".join(rng.choices(words, k=prompt_tokens // 2))
                prompt = {
                    "id": f"sharegpt:{i:08d}",
                    "source": "sharegpt",
                    "messages": [{"role": "user", "content": question}],
                }
                fp.write(json.dumps(prompt) + "\n")
                answer = " ".join(rng.choices(words, k=completion_tokens * 4 // 6))
                entry = {
                    "status": "ok",
                    "key": answers_lib.prompt_key(prompt),
                    **prompt,
                    "prompt_token_ids": [rng.randrange(VOCAB) for _ in range(prompt_tokens)],
                    "completion_token_ids": [
                        rng.randrange(VOCAB) for _ in range(completion_tokens)
                    ],
                    "content": answer,
                    "reasoning": None,
                    "finish_reason": "length",
                    "latency_s": round(rng.uniform(1, 60), 4),
                }
                fj.write(json.dumps(entry, separators=(",", ":")) + "\n")
        tmp.rename(journal)
    return {
        "answers": answers,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "journal_bytes": journal.stat().st_size,
        "pool": str(pool),
        "partial": str(journal.parent.parent),
    }


def phase(name: str, partial: str, pool: str) -> dict:
    """One phase in this process (run as a child of the benchmark)."""
    import resource

    from eagle3_pipeline.synth import records, stage
    from eagle3_pipeline.synth.answers import AnswerStore

    prompts = records.read_prompts(pool)
    cfg = {"context": "dataset"}
    t0 = time.monotonic()
    store = AnswerStore(partial, FINGERPRINT)
    entries = store.read()
    if name == "part":
        work = stage.part_work(prompts, entries, 0, 1, cfg, 4096)
        figure = {"reused": work.reused, "to_ask": len(work.todo)}
    else:
        last, _ = records.outcomes(prompts, entries, cfg)
        in_order = (last[p["id"]] for p in prompts)
        load = getattr(store, "full", None)  # (code that keeps the whole entries has none)
        tokens = sum(len(e["completion_token_ids"]) for e in (load or iter)(in_order))
        figure = {"answers": len(last), "completion_tokens": tokens}
    return {
        **figure,
        "seconds": time.monotonic() - t0,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def measure(src: Path, name: str, data: dict, repeats: int) -> dict:
    runs = []
    for _ in range(repeats):
        env = {**os.environ, "PYTHONPATH": str(src)}
        cmd = [sys.executable, __file__, "--phase", name, data["partial"], data["pool"]]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        runs.append(json.loads(out.splitlines()[-1]))
        print(name, src, runs[-1], flush=True)
    return {
        "runs": runs,
        "seconds_median": round(statistics.median(r["seconds"] for r in runs), 2),
        "peak_rss_mib_max": round(max(r["peak_rss_mib"] for r in runs)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--phase", nargs=3, metavar=("NAME", "PARTIAL", "POOL"), help=argparse.SUPPRESS)
    ap.add_argument("--answers", type=int, default=100_000)
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    ap.add_argument("--completion-tokens", type=int, default=2000)
    ap.add_argument("--work", type=Path, default=Path("/tmp/synth-journal-scale"))
    ap.add_argument("--src", type=Path, nargs="*", default=[REPO / "src"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.phase:
        print(json.dumps(phase(*args.phase)))
        return
    data = make_journal(args.work, args.answers, args.prompt_tokens, args.completion_tokens)
    print(json.dumps(data), flush=True)
    results: dict = {str(src): {} for src in args.src}
    for name in ("part", "gather"):  # the versions one after the other within each phase
        for src in args.src:
            results[str(src)][name] = measure(src.resolve(), name, data, args.repeats)
    if args.out:
        revisions = {str(src): revision(src) for src in args.src}
        write_result(
            args.out,
            {
                "what": "synth journal bookkeeping at scale",
                "data": data,
                "by_source": results,
                "revisions": revisions,
                "cpus": os.cpu_count(),
                "loadavg_after": os.getloadavg(),
            },
        )


def revision(src: Path) -> str:
    """The commit of the checkout ``src`` is in, and whether its tree has changes."""
    git = ["git", "-C", str(src)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--", "."], capture_output=True, text=True
    )
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


if __name__ == "__main__":
    main()
