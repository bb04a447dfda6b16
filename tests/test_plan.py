"""The plan printed before any job (eagle3_pipeline.plan, docs/plan.md), on stand-in model
directories with published config.json files: what it shows for the Llama-3.1-8B and
Kimi-K2.5 profiles, and the traps it stops before synth (disk, GPU memory, a hub target that
cannot be fetched, a GPU target trained on the CPU)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from eagle3_pipeline import config as cfglib
from eagle3_pipeline import plan as planlib
from eagle3_pipeline.plan.model_shape import param_counts

from smkcli import REPO, parse_jobs, snakemake

GIB = 2**30


def profile(name: str, target: Path, **sections) -> dict:
    """A profile merged onto the embedded default, as `--configfile` does."""
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg = cfglib.deep_update(cfg, yaml.safe_load((REPO / "config" / f"{name}.yaml").read_text()))
    cfg["target"]["path"] = str(target)
    return cfglib.validate(cfglib.deep_update(cfg, sections))


def plan_lines(output: str) -> dict[str, str]:
    """The plan's `label  value` lines of a snakemake output."""
    start = output.index("Plan for ")
    lines = {}
    for line in output[start:].splitlines()[1:]:
        if not line.startswith("  "):
            break
        label, _, value = line.strip().partition("  ")
        lines[label.strip()] = value.strip()
    return lines


def stage_rows(output: str) -> dict[str, list[str]]:
    """The plan's per-stage table of a snakemake output: its cells by stage, from jobs on."""
    lines = output[output.index("Plan for ") :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("per stage"))
    rows = {}
    for line in lines[start + 2 :]:  # after the line that heads the table and its header
        if not line.startswith("    "):
            break
        stage, *cells = re.split(r"\s{2,}", line.strip())
        rows[stage] = cells
    return rows


def dry_run(workdir: Path, configfile: str, *config: str, check: bool = True, real=False):
    args = ["--cores", "1", "--configfile", str(REPO / "config" / configfile)]
    args += ["--config", *config] if config else []
    return snakemake(*([] if real else ["-n"]), *args, workdir=workdir, check=check)


@pytest.fixture(scope="module")
def kimi(stand_in_model) -> Path:
    return stand_in_model("kimi-k2.5")


@pytest.fixture(scope="module")
def llama(stand_in_model) -> Path:
    return stand_in_model("llama-3.1-8b")


def test_kimi_config_has_the_published_size():
    raw = json.loads((REPO / "tests/data/models/kimi-k2.5/config.json").read_text())
    p = param_counts(raw["text_config"])
    assert 1.0e12 < p["total"] < 1.05e12 and 32e9 < p["active"] < 34e9  # "1T total, 32B active"


def test_kimi_plan_printed_by_a_dry_run(kimi, tmp_path):
    proc = dry_run(tmp_path, "kimi-k2.5.yaml", f"target={{path: {kimi}}}")
    lines = plan_lines(proc.output)
    assert lines["layers"] == "aux [2, 30, 58] + final 61 (captured [2, 30, 58, 61])"
    assert lines["draft vocab K"] == "32768"
    assert "61 layers, hidden 7168, vocab 163,840, MLA, 384 experts" in lines["target"]
    # INT4 routed experts (4 bits + a bf16 scale per 32), the rest bf16: ~594 GB published
    assert lines["weights"].startswith("553.4 GiB (estimate from config.json)")
    assert lines["GPU memory"].startswith("69.2 GiB of weights per GPU at TP 8")
    # jobs and GPUs per job; bench: the shared baseline (bench.pairing: separate) and eagle3
    rows = stage_rows(proc.output)
    assert {stage: cells[:2] for stage, cells in rows.items()} == {
        "synth": ["1", "8"],
        "extract": ["1", "8"],
        "train": ["1", "8"],
        "bench": ["2", "8"],
    }
    # 10,000 prompts less 8 held out, each up to prepare.seq_length 8192 tokens, 4 layers of 7168
    rows = 10000 - 8
    hs = rows * planlib.sample_bytes(8192, 4, 7168, "bf16")
    assert lines["rows"].startswith(f"{rows:,} x 8,192 tokens = {rows * 8192:,} tokens")
    assert lines["hidden states"].startswith(f"{hs / GIB:,.1f} GiB (bf16")
    for stage in ("synth", "extract", "train"):
        assert lines[f"{stage} time"].startswith(">= "), lines  # measured on smaller models
        assert (
            "estimate: " in lines[f"{stage} time"]
            and "benchmarks/results/" in lines[f"{stage} time"]
        )
    extract_jobs = [j for j in parse_jobs(proc.output) if j.rule == "extract"]
    assert len(extract_jobs) == 1 and extract_jobs[0].gpus == 8
    # ~4.3 TiB of hidden states do not fit this machine's disk: a dry run warns only
    assert "WARNING [disk], a real run stops before its first job" in proc.output


def test_llama_plan_printed_by_a_dry_run(llama, tmp_path):
    out = dry_run(tmp_path, "llama-8b.yaml", f"target={{path: {llama}}}").output
    lines = plan_lines(out)
    assert lines["layers"].startswith("aux [2, 16, 29] + final 32")
    assert lines["weights"].startswith("15.0 GiB")  # 8.03B bf16 parameters
    rows = stage_rows(out)
    assert {stage: cells[:2] for stage, cells in rows.items()} == {
        "synth": ["1", "1"],
        "extract": ["1", "1"],
        "train": ["1", "4"],
        "bench": ["1", "1"],
    }
    assert lines["extract time"].startswith("~ ")  # measured on the Llama-3.1-8B shape
    assert "h200_extract_throughput_8b_waitthreads_rounds.json" in lines["extract time"]


def test_a_too_small_disk_stops_a_real_run_before_synth(kimi, tmp_path):
    # a margin no disk meets, whatever this machine has free
    proc = dry_run(
        tmp_path,
        "kimi-k2.5.yaml",
        f"target={{path: {kimi}}}",
        "extract={disk_margin: 1000000}",
        real=True,
        check=False,
    )
    assert proc.returncode != 0
    assert "The plan refuses this run (nothing has started)" in proc.output
    assert "extract.storage: fp8" in proc.output and "plan.allow: [disk]" in proc.output
    run = tmp_path / "results" / "kimi-k2.5"
    assert not (run / "logs").exists() and not (run / "plan.json").exists()  # no job started


def test_the_disk_check_counts_what_is_stored_and_the_override(monkeypatch, llama, tmp_path):
    cfg = profile("llama-8b", llama, results_dir=str(tmp_path))
    free = {"bytes": 10**15}
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(planlib.shutil, "disk_usage", lambda p: usage._replace(free=free["bytes"]))
    assert planlib.make_plan(cfg, tmp_path / "llama-8b")["problems"] == []
    free["bytes"] = 10 * GIB
    plan = planlib.make_plan(cfg, tmp_path / "llama-8b")
    (problem,) = plan["problems"]
    assert problem["check"] == "disk" and "Free " in problem["message"]
    assert planlib.refusals(plan, cfg) == [problem["message"]]
    cfg["plan"]["allow"] = ["disk"]
    assert planlib.refusals(plan, cfg) == []
    # the extract job's check is the same code: refuses, or warns with the override
    with pytest.raises(planlib.DiskBudgetError, match=r"plan.allow: \[disk\]"):
        planlib.check_disk(tmp_path, 20 * GIB, 1.2)
    assert planlib.check_disk(tmp_path, 20 * GIB, 1.2, allow=True)["free_bytes"] == 10 * GIB


def test_weights_larger_than_the_gpus_at_the_tp_size(kimi, tmp_path):
    cfg = profile("kimi-k2.5", kimi, vllm={"tensor_parallel_size": 4, "gpu_memory_gib": 80})
    plan = planlib.make_plan(cfg, tmp_path / "kimi")
    msg = next(p["message"] for p in plan["problems"] if p["check"] == "gpu_memory")
    assert "138.3 GiB per GPU at vllm.tensor_parallel_size: 4" in msg
    assert "at least 8" in msg and "plan.allow" in msg
    ok = profile("kimi-k2.5", kimi, vllm={"gpu_memory_gib": 141})  # H200, TP 8
    assert "gpu_memory" not in {p["check"] for p in planlib.make_plan(ok, tmp_path)["problems"]}


def test_train_gpus_auto_follows_the_device():
    assert cfglib.validate({})["train"]["gpus"] == 0
    gpu = cfglib.validate({"vllm": {"device": "cuda", "tensor_parallel_size": 2}})
    assert gpu["train"]["gpus"] == 2


def test_an_explicit_cpu_training_beside_a_gpu_target_is_refused():
    cuda = {"vllm": {"device": "cuda"}, "train": {"gpus": 0}}
    with pytest.raises(cfglib.ConfigError, match=r"`train.gpus`: 0 trains the drafter on the CPU"):
        cfglib.validate(json.loads(json.dumps(cuda)))
    allowed = cfglib.validate({**json.loads(json.dumps(cuda)), "plan": {"allow": ["train_on_cpu"]}})
    assert allowed["train"]["gpus"] == 0


def test_readme_own_target_snippet_trains_on_the_gpus(tmp_path, llama):
    """README's "your own target" file, merged onto the embedded default as --configfile does."""
    text = (REPO / "README.md").read_text()
    start = text.index("Your own target and prompts:")
    block = text[start:].split("\n\n")[1]
    snippet = yaml.safe_load("\n".join(line[4:] for line in block.splitlines()))
    snippet["target"]["path"] = str(llama)
    snippet["prompts"] = {"train": [{"source": "sharegpt", "n": 10}]}
    snippet["bench"] = {"prompt_sets": ["mtbench"]}
    base = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg = cfglib.validate(cfglib.deep_update(base, snippet))
    assert cfg["vllm"]["device"] == "cuda" and cfg["train"]["gpus"] == 4


def hub_env(tmp_path: Path, monkeypatch) -> dict:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    return {}


def test_a_hub_target_missing_offline_is_said_by_the_dry_run(tmp_path, monkeypatch):
    hub_env(tmp_path, monkeypatch)
    args = ["target={source: hub, path: some-org/not-downloaded}"]
    proc = dry_run(tmp_path, "config.yaml", *args)
    assert "WARNING [hub], a real run stops before its first job" in proc.output
    assert "not in the local Hugging Face cache and HF_HUB_OFFLINE=1" in proc.output
    assert "hf download some-org/not-downloaded" in proc.output
    real = dry_run(tmp_path, "config.yaml", *args, real=True, check=False)
    assert real.returncode != 0 and "The plan refuses this run" in real.output
    assert not (tmp_path / "results" / "default" / "logs").exists()


def test_a_hub_target_in_the_cache_is_planned_offline(tmp_path, monkeypatch, llama):
    hub_env(tmp_path, monkeypatch)
    snap = tmp_path / "hf" / "hub" / "models--meta-llama--Llama-3.1-8B-Instruct"
    (snap / "refs").mkdir(parents=True)
    (snap / "refs" / "main").write_text("0" * 40)
    (snap / "snapshots" / ("0" * 40)).mkdir(parents=True)
    shutil.copy(llama / "config.json", snap / "snapshots" / ("0" * 40) / "config.json")
    proc = dry_run(
        tmp_path, "config.yaml", "target={source: hub, path: meta-llama/Llama-3.1-8B-Instruct}"
    )
    lines = plan_lines(proc.output)
    assert "32 layers, hidden 4096" in lines["target"] and "HF cache" in lines["target"]
    assert "WARNING" not in proc.output


def test_a_real_run_writes_its_plan(tmp_path, llama):
    """A plan without problems (a local 8B target on the CPU, the default's 160 prompts): a real
    run starts and keeps its plan beside the results (only the cheap target job is run)."""
    proc = snakemake(
        "--cores",
        "1",
        "--configfile",
        str(REPO / "config" / "config.yaml"),
        "--config",
        f"target={{source: local, path: {llama}}}",
        "run=planned",
        "--until",
        "target",
        workdir=tmp_path,
    )
    plan = json.loads((tmp_path / "results" / "planned" / "plan.json").read_text())
    assert plan["problems"] == [] and plan["layers"]["aux"] == [2, 16, 29]
    assert plan["stages"]["train"]["gpus_per_job"] == 0 and "gpu_memory" not in plan
    assert "Plan for results/planned" in proc.output
