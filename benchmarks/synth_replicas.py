"""Synth on one vLLM server against K servers sharing the same GPU (synth.servers_per_gpu).

    python benchmarks/synth_replicas.py --config config/gpu-quality.yaml --servers 4 \
        --prompts 4000 --rounds 3 --out replicas.json

Builds the synth prompts of --config (its prompts.train sources: for config/gpu-quality.yaml
every user turn of the packaged ShareGPT, in the pool's order; --prompts takes the first N),
starts one server and K more at once on the one GPU (the single server with --single-memory
of the GPU, the K with --replica-memory / K each; prefix caching off, so a repeated prompt is
prefilled again), and answers the same prompts with the synth stage's client
(``synth.generate``) in --rounds alternating rounds, the order reversed every round
(eagle3_lab.rounds): once on the one server, once spread over the K. It reports answer tokens/s
of each with its spread (median, min-max), the ratio per round, and whether the answers are
the same: per prompt, the completion token ids of every pass against the first pass of the
single server (at T = 0 a different batch composition may flip a bfloat16 near-tie on a GPU;
the single server's own rounds show how much of that is there without replicas). The result
records what else ran on the machine before and after every round; a GPU that other processes
use is refused unless --allow-shared-gpu.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from eagle3_lab import rounds as rounds_lib
from eagle3_lab.dummy_models import packaged_target_json
from eagle3_lab.results import write_result
from eagle3_pipeline import config as cfglib
from eagle3_pipeline import prompts, synth, target
from eagle3_pipeline.engine.spec import spec_for_target
from eagle3_pipeline.runtime import Progress, setup_logging
from eagle3_pipeline.runtime.files import AppendLog, iter_jsonl
from eagle3_pipeline.runtime.provenance import package_versions as versions
from eagle3_pipeline.server import Endpoint, VllmServer

REPO = Path(__file__).resolve().parents[1]


def answer_all(endpoints: list[Endpoint], rows: list[dict], cfg: dict) -> tuple[dict, dict]:
    """One pass: every row answered through ``endpoints``; (figures, completion ids by id)."""
    with tempfile.TemporaryDirectory() as tmp:
        journal = AppendLog(Path(tmp) / "journal.jsonl")
        journal.open()
        t0 = time.monotonic()
        outcome = asyncio.run(
            synth.generate(endpoints, rows, cfg, journal, Progress(len(rows), "pass", every_s=60))
        )
        wall = time.monotonic() - t0
        journal.close()
        ids = {e["id"]: e["completion_token_ids"] for e in journal.read() if e["status"] == "ok"}
    figures = {
        "tokens_per_s": outcome["completion_tokens"] / wall,
        "answers": outcome["ok"],
        "failed": outcome["failed"] + outcome["rejected"],
        "tokens": outcome["completion_tokens"],
        "wall_s": wall,
    }
    return figures, ids


def same_answers(reference: dict, other: dict) -> dict:
    common = set(reference) & set(other)
    same = sum(reference[i] == other[i] for i in common)
    return {"compared": len(common), "identical": same, "fraction": same / max(len(common), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", help="a pipeline config (e.g. config/gpu-quality.yaml)")
    ap.add_argument("--servers", type=int, default=4, help="K servers sharing the GPU")
    ap.add_argument("--prompts", type=int, help="the first N prompts of the pool (default all)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of both (>= 3)")
    ap.add_argument("--single-memory", type=float, default=0.3)
    ap.add_argument("--replica-memory", type=float, default=0.6, help="shared by the K")
    ap.add_argument("--allow-shared-gpu", action="store_true")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()
    if args.rounds < 3:
        ap.error("--rounds: at least 3 (a spread needs them)")
    setup_logging(None)
    before = rounds_lib.refuse_shared_gpu(args.allow_shared_gpu)
    cfg = cfglib.load(args.config) if args.config else cfglib.validate({})
    info = target.load_info(packaged_target_json(cfg["vllm"]["device"], REPO / "tests" / ".cache"))
    with tempfile.TemporaryDirectory() as tmp:
        prompts.build_train(
            {**cfg["prompts"], "heldout": 0},
            train_out=Path(tmp) / "p.jsonl.zst",
            stats_out=Path(tmp) / "s.json",
        )
        rows = list(iter_jsonl(Path(tmp) / "p.jsonl.zst"))[: args.prompts]
    s = {**cfg["synth"], "endpoint": None}
    base_args = ["--no-enable-prefix-caching"]

    def spec(memory: float):
        extra = [*base_args, "--gpu-memory-utilization", f"{memory:.4f}"]
        if cfg["vllm"]["device"] != "cuda":
            extra = base_args
        return spec_for_target(cfg["vllm"], info, extra_args=extra)

    answers: dict[str, list[dict]] = {"single": [], "replicas": []}

    def timed(which: str, endpoints: list[Endpoint]):
        def run() -> dict:
            figures, ids = answer_all(endpoints, rows, s)
            answers[which].append(ids)
            return figures

        return run

    log_dir = Path(tempfile.gettempdir())
    with VllmServer(spec(args.single_memory), log_dir / "replicas-single.log") as single:
        servers = [single]
        replicas = []
        try:
            for k in range(args.servers):
                server = VllmServer(
                    spec(args.replica_memory / args.servers), log_dir / f"replicas-{k}.log"
                )
                server.__enter__()
                replicas.append(server)
            servers += replicas
            one = [Endpoint(single.base_url, single.model_name, server=single)]
            many = [Endpoint(r.base_url, r.model_name, server=r) for r in replicas]
            for group in (one, many):  # warm-up: CUDA graphs, first requests
                answer_all(group, rows[: 8 * len(group)], s)
            result = rounds_lib.alternate(
                {"single": timed("single", one), "replicas": timed("replicas", many)},
                args.rounds,
                servers,
            )
        finally:
            for server in reversed(replicas):
                server.__exit__(None, None, None)
    rates = {k: rounds_lib.figure(result, k, "tokens_per_s") for k in ("single", "replicas")}
    spread = {k: rounds_lib.spread(v) for k, v in rates.items()}
    paired = rounds_lib.paired_ratios(result, "replicas", "single", "tokens_per_s")
    reference = answers["single"][0]
    identity = {
        "single_rounds_vs_first": [same_answers(reference, a) for a in answers["single"][1:]],
        "replicas_rounds_vs_single_first": [
            same_answers(reference, a) for a in answers["replicas"]
        ],
    }
    ratio = rounds_lib.spread(paired)
    print(
        f"\nanswer tok/s median (min-max): 1 server {spread['single']['median']:.0f} "
        f"({spread['single']['min']:.0f}-{spread['single']['max']:.0f}), {args.servers} servers "
        f"{spread['replicas']['median']:.0f} ({spread['replicas']['min']:.0f}-"
        f"{spread['replicas']['max']:.0f}); ratio per round {ratio['median']:.2f} "
        f"({ratio['min']:.2f}-{ratio['max']:.2f})\n"
        f"identical answers vs the single server's first pass: single "
        f"{[round(x['fraction'], 3) for x in identity['single_rounds_vs_first']]}, replicas "
        f"{[round(x['fraction'], 3) for x in identity['replicas_rounds_vs_single_first']]}"
    )
    if args.out:
        write_result(
            args.out,
            {
                "protocol": "alternating rounds, order reversed every round; the same "
                "prompts every pass, prefix caching off",
                "servers": args.servers,
                "prompts": len(rows),
                "runs": rates,
                "spread": spread,
                "ratio_per_round": paired,
                "ratio": ratio,
                "identical_answers": identity,
                "rounds": result["rounds"],
                "surroundings_before": before,
                "surroundings_servers_up": result["before"],
                "args": vars(args),
                "vllm": cfg["vllm"],
                "synth": s,
                "versions": versions(),
            },
        )


if __name__ == "__main__":
    main()
