"""The plan's arithmetic for an MLA + MoE target against what the miniature Kimi-K2.5 has and
what a run of it measured: weight bytes and parameters from config.json alone (the formulas the
plan uses for a 1T checkpoint it has not seen) against the weight files, W4A16 experts
included; hidden-state bytes per token and rows against the stored shards; each stage's time
estimate against its job's benchmark file.

    .venv/bin/python benchmarks/plan_vs_miniature.py --models DIR [DIR ...] --run RUN_DIR \
        [--out benchmarks/results/miniature/plan_vs_measured.json]

DIR: miniature builds (scripts/build_miniature.py, W4A16 and bf16); RUN_DIR: a finished run
of the miniature's DAG (its results/<run>, e.g. what ``pytest --full --basetemp=/tmp/dagkeep
tests/test_miniature_dag.py`` leaves under /tmp/dagkeep/kimi0/results/kimi-miniature).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

from eagle3_lab.results import write_result
from eagle3_pipeline.plan import model_shape

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "I64": 8, "U8": 1, "I8": 1}


def part(key: str) -> str:
    """The plan's class of a checkpoint tensor (model_shape.param_counts' names)."""
    if not key.startswith("language_model.") and "layers." not in key:
        return "outside the text model"  # the wrapper's vision tower and projector
    if ".mlp.experts." in key:
        return "routed_experts"
    if "embed_tokens" in key or "lm_head" in key:
        return "embeddings"
    return "linear"


def counted(model_dir: Path) -> dict:
    """Bytes and parameters per class in the weight files; a packed int4 tensor counts the
    parameters of the shape it records (``weight_shape``), not its int32 words."""
    from safetensors import safe_open

    out: dict[str, dict[str, int]] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            names = f.keys()  # a safe_open handle is not iterable
            for key in names:
                sl = f.get_slice(key)
                numel = math.prod(sl.get_shape())
                row = out.setdefault(part(key), {"bytes": 0, "params": 0})
                row["bytes"] += numel * DTYPE_BYTES[sl.get_dtype()]
                if key.endswith(".weight_packed"):
                    shape = f.get_tensor(key.removesuffix("_packed") + "_shape")
                    row["params"] += int(math.prod(shape.tolist()))
                elif not key.endswith((".weight_scale", ".weight_shape")):
                    row["params"] += numel
    return out


def model_row(model_dir: Path) -> dict:
    config = json.loads((model_dir / "config.json").read_text())
    planned = model_shape.param_counts(model_shape.text_config(config))
    have = counted(model_dir)
    files = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    estimate = model_shape.estimated_weight_bytes(config)
    return {
        "model": str(model_dir),
        "quantization": (config.get("text_config") or config)
        .get("quantization_config", {})
        .get("format"),
        "weight_bytes": {"planned": estimate, "files": files, "ratio": round(estimate / files, 4)},
        "params": {
            name: {
                "planned": planned[name],
                "counted": have.get(name, {}).get("params", 0),
                "bytes": have.get(name, {}).get("bytes", 0),
            }
            for name in ("routed_experts", "linear", "embeddings")
        },
        "outside_the_text_model": have.get("outside the text model", {"bytes": 0, "params": 0}),
    }


def job_seconds(run: Path, job: str) -> float:
    with (run / "benchmarks" / f"{job}.tsv").open() as f:
        return float(next(csv.DictReader(f, delimiter="\t"))["s"])


def run_row(run: Path) -> dict:
    plan = json.loads((run / "plan.json").read_text())
    manifest = json.loads((run / "hidden_states" / "manifest.json").read_text())
    storage = plan["disk"]["storage"]
    planned_bytes = plan["disk"]["bytes_by_storage"][storage]
    stages = {}
    for stage, jobs in (("synth", ["synth_part0"]), ("extract", ["extract_part0"])):
        stages[stage] = {
            "planned_s": plan["stages"][stage]["estimate"]["seconds"],
            "measured_s": sum(job_seconds(run, j) for j in jobs),
            "rate_measured_on": plan["stages"][stage]["estimate"]["measured_on"],
        }
    stages["train"] = {
        "planned_s": plan["stages"]["train"]["estimate"]["seconds"],
        "measured_s": job_seconds(run, "train_eagle3"),
        "rate_measured_on": plan["stages"]["train"]["estimate"]["measured_on"],
    }
    return {
        "run": str(run),
        "storage": storage,
        "rows": {"planned_tokens": plan["rows"]["tokens"], "stored_tokens": manifest["tokens"]},
        "hidden_state_bytes": {"planned": planned_bytes, "stored": manifest["bytes"]},
        "bytes_per_token": {
            "planned": round(planned_bytes / plan["rows"]["tokens"], 1),
            "stored": round(manifest["bytes_per_token"], 1),
        },
        "stages": stages,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=Path, nargs="+", required=True)
    ap.add_argument("--run", type=Path, required=True, help="a finished run of the miniature")
    ap.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/miniature/plan_vs_measured.json")
    )
    args = ap.parse_args()
    result = write_result(
        args.out,
        {"models": [model_row(m) for m in args.models], "run": run_row(args.run)},
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
