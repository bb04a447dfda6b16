"""A thinking target through the whole DAG on the CPU, and what the synth check makes of it.

    .venv/bin/python benchmarks/thinking_check.py --out benchmarks/results/thinking_cpu/summary.json

Runs Snakemake with benchmarks/configs/thinking_cpu.yaml (the packaged SmolLM2 under a thinking
chat template, answers split by vLLM's reasoning parser), then reads the run's own files: the
reasoning capture rate and template check of synth/stats.json, the drafter's verdict, and - on
the stored records - how many the re-render check (the one for targets without a reasoning
parser, which re-renders the answer through the template) would flag against the check that
follows the parser's markers. Copies the run's stats.json files and report.html (< 1 MB) next
to the summary.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from eagle3_lab.results import write_result
from eagle3_pipeline import config as cfglib
from eagle3_pipeline.runtime.files import iter_jsonl, read_json
from eagle3_pipeline.synth import check as reasoning
from eagle3_pipeline.target import chat_template_text, load_info

CONFIG = Path("benchmarks/configs/thinking_cpu.yaml")


def run_dag(snakemake_args: list[str]) -> float:
    snakemake = Path(sys.executable).parent / "snakemake"
    t0 = time.monotonic()
    cmd = [str(snakemake), "--cores", "all", "--configfile", str(CONFIG), *snakemake_args]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return time.monotonic() - t0


def compare_checks(run: Path, synth_cfg: dict) -> dict:
    """Both checks over the stored records: the re-render one and the parser-marker one."""
    from transformers import AutoTokenizer

    target = load_info(run / "target" / "target.json")
    tok = AutoTokenizer.from_pretrained(target["model_path"])
    template = chat_template_text(target)
    kwargs = synth_cfg["chat_template_kwargs"]
    markers = reasoning.parser_markers(synth_cfg["reasoning_parser"], tok)
    old, new, example = Counter(), Counter(), None
    records = list(iter_jsonl(run / "synth" / "synth.jsonl.zst"))
    for rec in records:
        before = reasoning.rerender_check(tok, rec, kwargs, template)
        after = reasoning.check_record(tok, rec, kwargs, markers, template)
        old[before["kind"] if before else "ok"] += 1
        new[after["kind"] if after else "ok"] += 1
        if before and before["kind"] == "text" and example is None:
            example = before
    return {
        "records": len(records),
        "rerender_check": dict(old),
        "marker_check": dict(new),
        "rerender_first_text_mismatch": example,
        "markers": [markers.start, markers.end],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--skip-run", action="store_true", help="read a finished run only")
    ap.add_argument("snakemake_args", nargs="*", help="passed to snakemake")
    args = ap.parse_args()
    cfg = cfglib.load_files([CONFIG])
    run = Path(cfg["results_dir"]) / cfg["run"]
    wall = None if args.skip_run else round(run_dag(args.snakemake_args), 1)

    synth = read_json(run / "synth" / "stats.json")
    bench = {p.parent.name: read_json(p) for p in sorted((run / "bench").glob("*/metrics.json"))}
    summary = {
        "config": str(CONFIG),
        "wall_s": wall,
        "synth": {
            k: synth[k]
            for k in ("samples_ok", "finish_reasons", "reasoning_capture_rate", "reasoning_parser")
        },
        "template_check": synth["template_check"],
        "checks_compared": compare_checks(run, cfg["synth"]),
        "bench": {
            name: {
                "verdict": m.get("verdict"),
                "chat_template_kwargs": m.get("chat_template_kwargs"),
                "summary": m.get("summary"),
            }
            for name, m in bench.items()
        },
    }
    write_result(args.out, summary)
    keep = args.out.parent / "run"
    for path in [*run.glob("**/stats.json"), *run.glob("**/report.html")]:
        if ".partial" in path.parts or ".cache" in path.parts or path.stat().st_size > 1 << 20:
            continue
        dest = keep / path.relative_to(run)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
    c = summary["checks_compared"]
    print(
        f"reasoning capture rate {summary['synth']['reasoning_capture_rate']:.2f}; "
        f"re-render check: {c['rerender_check']}; marker check: {c['marker_check']}"
    )


if __name__ == "__main__":
    main()
