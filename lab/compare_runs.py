"""Two finished runs of the same config compared stage by stage (a refactoring's invariants):
the bytes of each stage's outputs, the synth records' token ids, the hidden-state values, the
drafter's validation prediction and its acceptance length.

    PYTHONPATH=src .venv/bin/python lab/compare_runs.py RUN_A RUN_B [RUN_C ...] --out cmp.json

Every run is compared with the first. Hidden states are compared value by value (bfloat16
storage of a float32 CPU prefill: a batch composed differently may round a value the other
way), so that a difference can be told from the run-to-run variation of the same code (give a
second run of the first code as RUN_B to see it).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
from pathlib import Path

from eagle3_lab.results import write_result
from eagle3_pipeline.runtime.files import iter_jsonl

FILES = [
    "prompts/train.jsonl.zst",
    "prompts/bench_mtbench.jsonl",
    "prompts/bench_humaneval.jsonl",
    "prompts/bench_heldout.jsonl",
    "vocab/d2t.npy",
    "vocab/t2d.npy",
]


def tree_sha(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(f.relative_to(path).as_posix().encode() + f.read_bytes())
    return h.hexdigest()


def hidden_states(a: Path, b: Path) -> dict:
    import torch
    from safetensors.torch import load_file

    fa = sorted(glob.glob(str(a / "hidden_states" / "shards" / "*" / "hs_*.safetensors")))
    fb = sorted(glob.glob(str(b / "hidden_states" / "shards" / "*" / "hs_*.safetensors")))
    out = {"samples": len(fa), "differing_samples": 0, "differing_values": 0, "values": 0}
    worst = 0.0
    for x, y in zip(fa, fb, strict=True):
        ta, tb = load_file(x), load_file(y)
        for k in ta:
            out["values"] += ta[k].numel()
            if torch.equal(ta[k], tb[k]):
                continue
            out["differing_samples"] += 1
            out["differing_values"] += int((ta[k] != tb[k]).sum())
            if ta[k].is_floating_point():
                d = (ta[k].float() - tb[k].float()).abs().max() / ta[k].float().abs().max()
                worst = max(worst, float(d))
    out["worst_relative_difference"] = worst
    return out


def compare(a: Path, b: Path) -> dict:
    files = {f: (a / f).read_bytes() == (b / f).read_bytes() for f in FILES}
    files["prepare/dataset"] = tree_sha(a / "prepare" / "dataset") == tree_sha(
        b / "prepare" / "dataset"
    )
    ra = list(iter_jsonl(a / "synth" / "synth.jsonl.zst"))
    rb = list(iter_jsonl(b / "synth" / "synth.jsonl.zst"))
    ids = ("prompt_token_ids", "completion_token_ids")
    synth = {
        "records": len(ra),
        "same_token_ids": sum(
            x["id"] == y["id"] and all(x[k] == y[k] for k in ids)
            for x, y in zip(ra, rb, strict=True)
        ),
        "same_bytes": (a / "synth" / "synth.jsonl.zst").read_bytes()
        == (b / "synth" / "synth.jsonl.zst").read_bytes(),
    }
    ma = json.loads((a / "hidden_states" / "manifest.json").read_text())
    mb = json.loads((b / "hidden_states" / "manifest.json").read_text())

    def tau(run: Path) -> dict:
        bench = json.loads((run / "bench" / "eagle3" / "metrics.json").read_text())
        return {r["prompt_set"]: r["acceptance_length"] for r in bench["runs"]}

    def prediction(run: Path) -> dict:
        return json.loads((run / "drafter" / "eagle3" / "metrics.json").read_text())["prediction"]

    return {
        "same_bytes": files,
        "synth": synth,
        "hidden_states": {
            **hidden_states(a, b),
            "samples_sha256_equal": ma["samples_sha256"] == mb["samples_sha256"],
            "next_token_agreement": [
                ma["verification"]["next_token_agreement"],
                mb["verification"]["next_token_agreement"],
            ],
        },
        "validation_prediction_equal": prediction(a) == prediction(b),
        "tau": [tau(a), tau(b)],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out")
    args = ap.parse_args()
    first = args.runs[0]
    result = {str(r): compare(first, r) for r in args.runs[1:]}
    print(json.dumps(result, indent=2))
    if args.out:
        write_result(args.out, {"first": str(first), "against": result})


if __name__ == "__main__":
    main()
