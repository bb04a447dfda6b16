"""The plan printed before any job: what the run will need, and whether this machine has it.

From the config and the target's config.json alone (no weights loaded): the target's shape,
the layers EAGLE-3 reads, the draft vocabulary, the tokens and hidden-state bytes the run
will produce against the free disk where they go, the weights against GPU memory at the
tensor-parallel size, the GPUs of each job, and each stage's time from rates measured in
benchmarks/results/ (estimates). A real run is refused before its first job when the disk or
the GPUs cannot hold it (``plan.allow`` overrides); a dry run prints the same as warnings.

The extract stage checks its disk with the same code (:func:`check_disk`), on the rows it
really has. Role: infrastructure (its folder: staleness.code.role) — the plan decides whether
and where a run starts, never what a stage computes; no stage's result depends on it.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

from ..hidden_states.layers import LayerIdError, resolve_layers
from ..runtime.gpus import nvidia_smi_rows
from . import model_shape
from .rates import stage_times

log = logging.getLogger(__name__)

GIB = 2**30
BYTES_PER_VALUE = {"bf16": 2, "fp8": 1}
CHARS_PER_TOKEN = 4  # English text; a prompt has at most prompts.max_chars characters
VLLM_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default --gpu-memory-utilization
ALLOW_KEY = "plan.allow"


class DiskBudgetError(RuntimeError):
    pass


# ---- disk: the one check, at planning time and in the extract job ---------------------------


def sample_bytes(tokens: int, num_layers: int, hidden: int, storage: str) -> int:
    """Bytes of one sample file (tensor data plus a small safetensors header)."""
    data = tokens * num_layers * hidden * BYTES_PER_VALUE[storage] + tokens * 8
    if storage == "fp8":
        data += tokens * 4  # per-token float32 scales
    return data + 512


def free_bytes(path: Path) -> tuple[int, Path]:
    """Free bytes of the file system ``path`` will be on (its nearest existing parent)."""
    p = Path(path).resolve()
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free, p


def disk_problem(needed: int, free: int, margin: float, where: Path) -> str | None:
    """What to do when ``needed`` bytes (times ``margin``) do not fit ``free``; else None."""
    if needed * margin <= free:
        return None
    short = needed * margin - free
    return (
        f"hidden states need about {needed / GIB:.1f} GiB (x{margin} margin = "
        f"{needed * margin / GIB:.1f} GiB) but {where} has {free / GIB:.1f} GiB free. "
        f"Free {short / GIB:.1f} GiB, point results_dir at a bigger disk, use extract.storage: "
        "fp8 (half the size, at about the same extraction rate), or lower prepare.seq_length / "
        "the number of prompts; or set "
        f"{ALLOW_KEY}: [disk] to proceed anyway."
    )


def check_disk(root: Path, needed: int, margin: float, allow: bool = False) -> dict[str, Any]:
    """The extract job's check, on its real rows: refuse (DiskBudgetError) unless allowed."""
    root.mkdir(parents=True, exist_ok=True)
    free, _ = free_bytes(root)
    info = {"estimated_bytes": needed, "free_bytes": free, "margin": margin}
    problem = disk_problem(needed, free, margin, root)
    if problem and not allow:
        raise DiskBudgetError(problem)
    if problem:
        log.warning("%s (%s lists disk: proceeding)", problem, ALLOW_KEY)
    log.info("disk: %.2f GiB needed, %.1f GiB free", needed / GIB, free / GIB)
    return info


def bytes_under(path: Path) -> int:
    """Bytes already stored under ``path`` (finished samples are reused, not rewritten)."""
    if not path.is_dir():
        return 0
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ---- GPU memory -------------------------------------------------------------------------------


def gpu_memory_gib(setting) -> tuple[float | None, str]:
    """Memory of one GPU: vllm.gpu_memory_gib, or with auto the smallest GPU nvidia-smi
    lists on the planning machine (none there, e.g. a cluster login node: unknown)."""
    if setting != "auto":
        return float(setting), "vllm.gpu_memory_gib"
    try:
        rows = nvidia_smi_rows("gpu=memory.total", timeout=20)
        if rows is None:
            return None, "unknown: no nvidia-smi here; set vllm.gpu_memory_gib"
        mib = [float(r[0]) for r in rows]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None, "unknown: nvidia-smi failed; set vllm.gpu_memory_gib"
    if not mib:
        return None, "unknown: nvidia-smi lists no GPU; set vllm.gpu_memory_gib"
    return min(mib) / 1024, f"nvidia-smi ({len(mib)} GPU(s))"


def memory_utilization(args: list[str]) -> float:
    """--gpu-memory-utilization among the server arguments, else vLLM's default."""
    for i, a in enumerate(args):
        if a.startswith("--gpu-memory-utilization"):
            value = a.partition("=")[2] or (args[i + 1] if i + 1 < len(args) else "")
            try:
                return float(value)
            except ValueError:
                break
    return VLLM_GPU_MEMORY_UTILIZATION


# ---- the plan ---------------------------------------------------------------------------------


def expected_rows(cfg: dict, run: Path) -> dict[str, Any]:
    """Training rows and their tokens: measured (prepare/stats.json of this run) when synth
    and prepare have run, else an upper bound from the config."""
    stats = run / "prepare" / "stats.json"
    try:
        s = json.loads(stats.read_text())
    except (OSError, ValueError):  # not there yet (or an empty placeholder): the bound below
        s = {}
    if isinstance(s, dict) and s.get("rows_kept") and s.get("tokens_total"):
        return {
            "samples": s["rows_kept"],
            "tokens": s["tokens_total"],
            "tokens_per_sample": s["tokens_total"] / s["rows_kept"],
            "how": f"measured ({stats})",
        }
    ns = [src.get("n") for src in cfg["prompts"]["train"]]
    samples = None if None in ns else max(sum(ns) - cfg["prompts"]["heldout"], 0)
    per = min(
        cfg["prepare"]["seq_length"],
        math.ceil(cfg["prompts"]["max_chars"] / CHARS_PER_TOKEN) + cfg["synth"]["max_tokens"],
    )
    how = (
        f"upper bound: prompt <= prompts.max_chars/{CHARS_PER_TOKEN} tokens + "
        "synth.max_tokens, cut at prepare.seq_length"
    )
    if any(src.get("each_turn") for src in cfg["prompts"]["train"]):
        how += "; each_turn sources give more samples than prompts"
    return {
        "samples": samples,
        "tokens": samples * per if samples is not None else None,
        "tokens_per_sample": per,
        "how": how,
    }


def make_plan(cfg: dict, run: str | Path) -> dict[str, Any]:
    """Everything the plan shows, as a JSON-able dict; ``problems`` lists the refusals."""
    from ..config import stage_gpus  # config imports this module's users; import late
    from ..methods import extra_layer_ids

    run = Path(run)
    problems: list[dict[str, str]] = []
    plan: dict[str, Any] = {"run": str(run), "problems": problems}
    v, x = cfg["vllm"], cfg["extract"]
    try:
        raw, where, model_dir, index_total = model_shape.read_config(cfg["target"], run)
    except model_shape.TargetNotFound as err:
        problems.append({"check": "hub", "message": str(err)})
        raw = None
    except (OSError, ValueError) as err:  # an unreadable config.json: the target job fails too
        problems.append({"check": "target", "message": f"cannot read the target's config: {err}"})
        raw = None
    gpus = {
        "synth": stage_gpus(cfg, "synth"),
        "extract": stage_gpus(cfg, "extract"),
        "train": stage_gpus(cfg, "train"),
        "bench": stage_gpus(cfg, "bench"),
    }
    plan["jobs"] = {
        "synth": {"jobs": 0 if cfg["synth"]["endpoint"] else 1, "gpus_per_job": gpus["synth"]},
        "extract": {"jobs": x["jobs"], "gpus_per_job": gpus["extract"]},
        "train": {"jobs": len(cfg["train"]["methods"]), "gpus_per_job": gpus["train"]},
        "bench": {"gpus_per_job": gpus["bench"]},
    }
    rows = expected_rows(cfg, run)
    plan["rows"] = rows
    plan["draft_vocab_size"] = cfg["vocab"]["draft_vocab_size"]
    if raw is None:
        return plan
    try:
        shape = model_shape.shape(raw)
    except (KeyError, TypeError) as err:
        msg = (
            f"{where} has no {err}: not a model config.json the plan (or the target job) can "
            "read; point target.path at the model directory (for a dry run without the "
            "weights, a directory with the model's published config.json)"
        )
        problems.append({"check": "target", "message": msg})
        return plan
    dtype = cfg["target"]["dtype"] if cfg["target"]["source"] == "packaged" else None
    weights, weights_how = model_shape.weight_bytes(raw, model_dir, index_total, dtype)
    plan["target"] = {
        **shape,
        "config_from": where,
        "weight_bytes": weights,
        "weight_bytes_from": weights_how,
    }
    try:
        aux, captured, final = resolve_layers(
            {"layer_ids": x["layer_ids"], "method_layer_ids": extra_layer_ids(cfg["train"])},
            shape,
        )
    except LayerIdError as err:
        problems.append({"check": "layers", "message": str(err)})
        return plan
    plan["layers"] = {"aux": aux, "captured": [*captured, final], "final": final}
    per_sample = sample_bytes(
        round(rows["tokens_per_sample"]), len(captured) + 1, shape["hidden_size"], x["storage"]
    )
    hs_dir = run / "hidden_states"
    if rows["samples"] is not None:
        total = rows["samples"] * per_sample
        stored = bytes_under(hs_dir)
        free, on = free_bytes(hs_dir)
        plan["disk"] = {
            "hidden_state_bytes": total,
            "already_stored_bytes": stored,
            "storage": x["storage"],
            "free_bytes": free,
            "free_at": str(on),
            "margin": x["disk_margin"],
            "how": rows["how"],
        }
        problem = disk_problem(max(total - stored, 0), free, x["disk_margin"], on)
        if problem:
            problems.append({"check": "disk", "message": problem})
    if v["device"] == "cuda":
        tp = v["tensor_parallel_size"]
        gib, gib_from = gpu_memory_gib(v["gpu_memory_gib"])
        util = memory_utilization([*v["extra_args"], *x["server_args"]])
        plan["gpu_memory"] = {
            "weights_per_gpu_bytes": weights // tp,
            "tensor_parallel_size": tp,
            "gpu_gib": gib,
            "gpu_gib_from": gib_from,
            "utilization": util,
        }
        if gib is not None and weights / tp > gib * GIB * util:
            need_tp = math.ceil(weights / (gib * GIB * util))
            msg = (
                f"the target's weights ({weights / GIB:.0f} GiB, {weights_how}) need "
                f"{weights / tp / GIB:.1f} GiB per GPU at vllm.tensor_parallel_size: {tp}, "
                f"but vLLM may use {util} of a {gib:.0f} GiB GPU ({gib_from}) = "
                f"{gib * util:.1f} GiB. Set vllm.tensor_parallel_size to at least {need_tp} "
                "(it must divide the attention heads), use GPUs with more memory (set "
                f"vllm.gpu_memory_gib if it is read wrongly), or set {ALLOW_KEY}: "
                "[gpu_memory] to proceed anyway."
            )
            problems.append({"check": "gpu_memory", "message": msg})
    plan["time"] = stage_times(cfg, shape, rows, gpus)
    return plan


def refusals(plan: dict, cfg: dict) -> list[str]:
    """The problems a real run stops for: those ``plan.allow`` does not list."""
    allowed = set(cfg["plan"]["allow"])
    return [p["message"] for p in plan["problems"] if p["check"] not in allowed]


# ---- printing ---------------------------------------------------------------------------------


def _gib(n: float | None) -> str:
    return "?" if n is None else f"{n / GIB:,.1f} GiB"


def _duration(t: dict | None) -> str:
    if not t:
        return "no measured rate"
    s = t["seconds"]
    text = f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.0f} min" if s >= 60 else f"{s} s"
    return (
        f"{t['bound'] if t['bound'] != '~' else '~'} {text} (estimate: {t['rate']:,.0f} "
        f"{t['unit']} on {t['measured_on']}, {t['file']})"
    )


def format_plan(plan: dict) -> str:
    """The plan as a short table of label: value lines."""
    lines = [f"Plan for {plan['run']} (docs/plan.md):"]
    add = lambda k, val: lines.append(f"  {k:<17} {val}")  # noqa: E731
    tg = plan.get("target")
    if tg:
        moe = f", {tg['experts']} experts" if tg["experts"] else ""
        quant = f", {tg['quantization']}" if tg["quantization"] else ""
        add(
            "target",
            f"{(tg['architectures'] or ['?'])[0]} ({tg['model_type']}): "
            f"{tg['num_layers']} layers, hidden {tg['hidden_size']}, vocab {tg['vocab_size']:,}, "
            f"{tg['attention']}{moe}{quant}; {tg['params_total'] / 1e9:,.1f}B params "
            f"({tg['params_active'] / 1e9:,.1f}B active) from {tg['config_from']}",
        )
        add("weights", f"{_gib(tg['weight_bytes'])} ({tg['weight_bytes_from']})")
    if plan.get("layers"):
        ly = plan["layers"]
        add("layers", f"aux {ly['aux']} + final {ly['final']} (captured {ly['captured']})")
    add("draft vocab K", plan["draft_vocab_size"])
    r = plan["rows"]
    samples = "?" if r["samples"] is None else f"{r['samples']:,}"
    tokens = "?" if r["tokens"] is None else f"{r['tokens']:,}"
    add("rows", f"{samples} x {r['tokens_per_sample']:,.0f} tokens = {tokens} tokens ({r['how']})")
    if plan.get("disk"):
        d = plan["disk"]
        add(
            "hidden states",
            f"{_gib(d['hidden_state_bytes'])} ({d['storage']}; "
            f"{_gib(d['already_stored_bytes'])} stored) vs {_gib(d['free_bytes'])} free at "
            f"{d['free_at']} (x{d['margin']} margin)",
        )
    if plan.get("gpu_memory"):
        g = plan["gpu_memory"]
        gpu = "? GiB" if g["gpu_gib"] is None else f"{g['gpu_gib']:.0f} GiB"
        add(
            "GPU memory",
            f"{_gib(g['weights_per_gpu_bytes'])} of weights per GPU at TP "
            f"{g['tensor_parallel_size']} vs {gpu} x {g['utilization']} ({g['gpu_gib_from']})",
        )
    j = plan["jobs"]
    add(
        "GPUs per job",
        f"synth {j['synth']['gpus_per_job']} ({j['synth']['jobs']} job), extract "
        f"{j['extract']['gpus_per_job']} ({j['extract']['jobs']} job(s)), train "
        f"{j['train']['gpus_per_job']} ({j['train']['jobs']} job(s)), bench "
        f"{j['bench']['gpus_per_job']}",
    )
    for stage, t in (plan.get("time") or {}).items():
        add(f"{stage} time", t if isinstance(t, str) else _duration(t))
    for p in plan["problems"]:
        lines.append(
            f"  WARNING [{p['check']}], a real run stops before its first job: {p['message']}"
        )
    return "\n".join(lines)


def write(plan: dict, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan, indent=1, sort_keys=True) + "\n")
