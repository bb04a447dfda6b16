"""Adopt a synth journal carried from an earlier host, so that its answers are reused.

    PYTHONPATH=src python3 lab/gpu/adopt_synth_journal.py \\
        --configfile config/gpu-quality.yaml [more.yaml]

Run after the target and prompts_train jobs of that config, with the carried journal in
``results/<run>/synth/.partial/journal.jsonl``. The synth stage discards a journal whose
fingerprint (target identity, generation settings, answer format) differs from its own, and
reuses only entries keyed by their prompt. A journal written by an earlier version of the
stage (before answers were keyed) or under another fingerprint is therefore re-keyed here,
entry by entry, against the current training prompts, and stamped with the current
fingerprint. Only what the current config would ask for is adopted: an answer whose prompt id
is in the prompt file with the same messages, and a length rejection made under the same
``vllm.max_model_len``. The caller vouches that the answers came from the same target and
generation settings (same model files, same ``synth`` keys): this script cannot check that.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from eagle3_pipeline import config as cfglib
from eagle3_pipeline.runtime.files import iter_jsonl
from eagle3_pipeline.synth import answers
from eagle3_pipeline.target import load_info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configfile", nargs="+", required=True)
    a = ap.parse_args()
    first, *more = a.configfile
    overrides: dict = {}
    for f in more:  # later files win, merged as Snakemake merges them
        cfglib.deep_update(overrides, yaml.safe_load(Path(f).read_text()) or {})
    cfg = cfglib.load(first, overrides)
    run = Path("results") / cfg["run"]
    prompts = {p["id"]: p for p in iter_jsonl(run / "prompts/train.jsonl.zst")}
    work = run / "synth/.partial"
    max_len = cfg["vllm"]["max_model_len"]
    kept, counts = [], {"answers": 0, "rejections": 0, "other prompt": 0, "dropped": 0}
    for line in (work / "journal.jsonl").open():
        e = json.loads(line)
        p = prompts.get(e["id"])
        if p is None:
            counts["other prompt"] += 1
        elif e["status"] == "ok" and e["messages"][: len(p["messages"])] == p["messages"]:
            kept.append({**e, "key": answers.prompt_key(p)})
            counts["answers"] += 1
        elif e["status"] == "rejected" and f"maximum context length is {max_len} " in e["error"]:
            kept.append({**e, "key": answers.prompt_key(p), "max_model_len": max_len})
            counts["rejections"] += 1
        else:
            counts["dropped"] += 1
    with (work / "journal.jsonl").open("w") as f:
        f.writelines(json.dumps(e, separators=(",", ":")) + "\n" for e in kept)
    target = load_info(run / "target/target.json")
    fp = answers.fingerprint(target, cfg["synth"], cfg["vllm"])
    (work / "fingerprint.json").write_text(json.dumps({"fingerprint": fp}) + "\n")
    todo = len(prompts) - len(answers.settled(kept, list(prompts.values()), max_len))
    print(f"adopted {counts} for {len(prompts)} prompts; {todo} left to ask; fingerprint {fp}")


if __name__ == "__main__":
    main()
