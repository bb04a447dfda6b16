"""The plan printed before any job (eagle3_pipeline.plan, docs/plan.md), on stand-in model
directories with published config.json files: what it shows for the Llama-3.1-8B and
Kimi-K2.5 profiles, and the traps it stops before synth (disk, GPU memory, a hub target that
cannot be fetched, a GPU target trained on the CPU)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from itertools import pairwise
from pathlib import Path

import pytest
import yaml

from eagle3_pipeline import config as cfglib
from eagle3_pipeline import plan as planlib
from eagle3_pipeline.hidden_states.disk import sample_bytes
from eagle3_pipeline.plan.model_shape import param_counts
from eagle3_pipeline.runtime import disk

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


@pytest.mark.slow  # the snakemake CLI in a subprocess
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
    hs = rows * sample_bytes(8192, 4, 7168, "bf16")
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


# The anchor-scale Kimi-K2.5 run of docs/plan.md and docs/cluster.md: 600K prompts, 16 synth
# jobs and 8 extraction jobs of a TP=8 server each, training on 2 nodes of 8 GPUs.
ANCHOR = {
    "prompts": {"train": [{"source": "sharegpt", "n": 600_000}]},
    "synth": {"jobs": 16},
    "extract": {"jobs": 8},
    "train": {"nodes": 2},
    "vllm": {"gpu_memory_gib": 141},
}
ANCHOR_SAMPLES = 600_000 - 8  # prompts.heldout: 8
ANCHOR_TOKENS = ANCHOR_SAMPLES * 8192  # every row up to prepare.seq_length (an upper bound)


def measured(file: str, *keys: str) -> float:
    """A rate from benchmarks/results/efficiency/ as the plan reads it (to 0.1)."""
    value = json.loads((REPO / "benchmarks/results/efficiency" / file).read_text())
    for key in keys:
        value = value[key]
    return round(value, 1)


def anchor_plan(kimi: Path, tmp_path: Path, **changes) -> dict:
    sections = json.loads(json.dumps(ANCHOR))  # a copy: changes merge into it
    return planlib.make_plan(
        profile("kimi-k2.5", kimi, **cfglib.deep_update(sections, changes)), tmp_path / "kimi"
    )


def model_load_s(plan: dict) -> float:
    """A load of the weights at 1 GB/s: the fast end of the 10-40 min for ~600 GB that the
    Kimi-K2.5 profiles state."""
    return plan["target"]["weight_bytes"] / 1e9


def test_each_stage_has_its_jobs_gpu_hours_and_wall_time(kimi, tmp_path):
    plan = anchor_plan(kimi, tmp_path)
    stages, load = plan["stages"], model_load_s(plan)
    # synth: 16 jobs of 8 GPUs, every answer up to synth.max_tokens 16,384, split over the jobs,
    # at the rate measured on the nearest (smaller) target, plus one load per job
    synth_rate = measured("h200_synth_throughput_repeat2_rounds.json", "median", "pipeline")
    synth_s = ANCHOR_SAMPLES * 16384 / 16 / synth_rate + load
    synth = stages["synth"]
    assert (synth["jobs"], synth["gpus_per_job"]) == (16, 8)
    assert synth["estimate"]["seconds"] == pytest.approx(synth_s, abs=1)
    assert synth["estimate"]["gpu_hours"] == pytest.approx(16 * 8 * synth_s / 3600, rel=1e-6)
    extract_rate = measured(
        "h200_extract_throughput_8b_waitthreads_rounds.json", "median", "extract"
    )
    extract_s = ANCHOR_TOKENS / 8 / extract_rate + load
    extract = stages["extract"]
    assert (extract["jobs"], extract["gpus_per_job"]) == (8, 8)
    assert extract["estimate"]["seconds"] == pytest.approx(extract_s, abs=1)
    assert extract["estimate"]["gpu_hours"] == pytest.approx(8 * 8 * extract_s / 3600, rel=1e-6)
    # train: one job over 2 nodes x 8 GPUs, 10 epochs of the 95% of rows that are not validation,
    # data parallel at the rate per GPU; it loads no target
    train_rate = measured("h200_train_throughput.json", "ours", "tokens_per_s_per_gpu")
    train_s = ANCHOR_TOKENS * 0.95 * 10 / (train_rate * 16)
    train = stages["train"]
    assert (train["jobs"], train["gpus_per_job"], train["nodes_per_job"]) == (1, 16, 2)
    assert train["estimate"]["seconds"] == pytest.approx(train_s, abs=1)
    assert train["estimate"]["gpu_hours"] == pytest.approx(16 * train_s / 3600, rel=1e-6)
    assert train["estimate"]["load_seconds"] == 0
    # bench: the shared baseline and the eagle3 drafter, not estimated (no rate)
    assert (stages["bench"]["jobs"], stages["bench"]["gpus_per_job"]) == (2, 8)
    assert "estimate" not in stages["bench"] and stages["bench"]["not_estimated"]
    # the stages run one after another; measured on smaller models, each a lower bound
    totals = plan["totals"]
    assert totals["seconds"] == pytest.approx(synth_s + extract_s + train_s, abs=3)
    assert totals["gpu_hours"] == pytest.approx(
        (128 * synth_s + 64 * extract_s + 16 * train_s) / 3600, rel=1e-6
    )
    assert totals["bound"] == ">=" and totals["left_out"] == ["bench"]
    # the global batch grows with the processes; the learning rate stays as configured
    assert plan["train_batch"] == {
        "tokens_per_process": 8192,
        "processes": 16,
        "gpus_per_node": 8,
        "nodes": 2,
        "global_tokens": 131_072,
        "lr": 0.0001,
    }


@pytest.mark.parametrize("storage", ["bf16", "fp8"])
def test_hidden_state_bytes_in_both_storages(kimi, tmp_path, monkeypatch, storage):
    """Both sizes whichever storage is configured; the disk check uses the configured one."""
    both = {s: ANCHOR_SAMPLES * sample_bytes(8192, 4, 7168, s) for s in ("bf16", "fp8")}
    assert 0.5 < both["fp8"] / both["bf16"] < 0.51  # one byte a value and a scale per token
    # a disk that holds the fp8 states with their margin but not the bf16 ones
    usage = shutil.disk_usage(tmp_path)
    free = int(both["fp8"] * 1.2 * 1.01)
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda p: usage._replace(free=free))
    plan = anchor_plan(kimi, tmp_path, extract={"storage": storage})
    assert plan["disk"]["bytes_by_storage"] == both
    assert plan["disk"]["hidden_state_bytes"] == both[storage]
    assert plan["stages"]["extract"]["hidden_states"] == {"bytes": both, "io": "written"}
    assert plan["stages"]["train"]["hidden_states"]["bytes"] == both
    refused = {p["check"] for p in plan["problems"]}
    assert refused == ({"disk"} if storage == "bf16" else set())
    # what the GPUs of training must be fed, per storage: bytes per token x tokens per second
    train_rate = measured("h200_train_throughput.json", "ours", "tokens_per_s_per_gpu")
    read = plan["stages"]["train"]["read_bytes_per_s"]
    for s in both:
        assert read[s] == pytest.approx(both[s] / ANCHOR_TOKENS * train_rate * 16)


def test_an_external_synth_endpoint_is_neither_estimated_nor_counted(kimi, tmp_path):
    plan = anchor_plan(kimi, tmp_path, synth={"endpoint": "http://127.0.0.1:9/v1"})
    synth = plan["stages"]["synth"]
    assert synth["gpus_per_job"] == 0 and synth["estimate"] is None
    assert "synth.endpoint" in synth["not_estimated"]
    assert plan["totals"]["stages"] == ["extract", "train"]


def test_the_anchor_plan_scales_with_samples_jobs_and_nodes(kimi, tmp_path):
    base = anchor_plan(kimi, tmp_path)
    load = model_load_s(base)

    def estimate(plan, stage):
        return plan["stages"][stage]["estimate"]

    # twice the samples: twice the work in every stage; the loads (one per job) stay
    twice = anchor_plan(
        kimi, tmp_path, prompts={"train": [{"source": "sharegpt", "n": 2 * ANCHOR_SAMPLES + 8}]}
    )
    for stage, gpus in (("synth", 128), ("extract", 64)):
        loads = gpus * load / 3600
        assert estimate(twice, stage)["gpu_hours"] - loads == pytest.approx(
            2 * (estimate(base, stage)["gpu_hours"] - loads), rel=1e-6
        )
    assert estimate(twice, "train")["gpu_hours"] == pytest.approx(
        2 * estimate(base, "train")["gpu_hours"], rel=1e-6
    )
    # twice the synth jobs: half the wall time but for the load, the same GPU-hours plus the
    # 16 more jobs' loads
    more_jobs = anchor_plan(kimi, tmp_path, synth={"jobs": 32})
    assert estimate(more_jobs, "synth")["seconds"] - load == pytest.approx(
        (estimate(base, "synth")["seconds"] - load) / 2, abs=1
    )
    assert estimate(more_jobs, "synth")["gpu_hours"] == pytest.approx(
        estimate(base, "synth")["gpu_hours"] + 16 * 8 * load / 3600, rel=1e-6
    )
    # twice the training nodes: half the wall time, the same GPU-hours, twice the global batch
    # at the same learning rate
    more_nodes = anchor_plan(kimi, tmp_path, train={"nodes": 4})
    assert estimate(more_nodes, "train")["seconds"] == pytest.approx(
        estimate(base, "train")["seconds"] / 2, abs=1
    )
    assert estimate(more_nodes, "train")["gpu_hours"] == pytest.approx(
        estimate(base, "train")["gpu_hours"], rel=1e-4
    )
    assert more_nodes["train_batch"]["global_tokens"] == 2 * base["train_batch"]["global_tokens"]
    assert more_nodes["train_batch"]["lr"] == base["train_batch"]["lr"]


PLAN_MD = REPO / "docs" / "plan.md"


def documented_plans() -> list[tuple[str, str]]:
    """docs/plan.md's example plans: each `snakemake -n` command (its continuation lines
    joined) and the plan printed in the code block right after it."""
    blocks = [b for b in PLAN_MD.read_text().split("\n\n") if b.startswith("    ")]
    return [
        (
            " ".join(line.strip().removesuffix("\\").strip() for line in command.splitlines()),
            "\n".join(line[4:] for line in shown.splitlines()),
        )
        for command, shown in pairwise(blocks)
        if command.startswith("    snakemake -n ") and shown.startswith("    Plan for ")
    ]


def without_the_machine(plan: str) -> str:
    """A printed plan less what depends on the machine that printed it: where the stand-in
    model and the run directory are, and the free disk there."""
    plan = re.sub(r"from \S+/([^/\s]+)/config\.json", r"from .../\1/config.json", plan)
    plan = re.sub(r"free at \S+", "free at <workdir>", plan)
    plan = re.sub(r"but \S+ has", "but <workdir> has", plan)
    plan = re.sub(r"[\d,.]+ GiB free", "<free> GiB free", plan)
    return re.sub(r"Free [\d,.]+ GiB", "Free <short> GiB", plan)


def test_plan_md_shows_the_plain_and_the_anchor_scale_plans():
    commands = [command for command, _ in documented_plans()]
    assert len(commands) == 2, commands
    assert "n: 600000" in commands[1] and "synth={jobs: 16}" in commands[1]


@pytest.mark.slow  # the snakemake CLI in a subprocess
@pytest.mark.parametrize("command,shown", documented_plans(), ids=["10k", "600k"])
def test_the_plans_in_plan_md_are_what_their_commands_print(command, shown, tmp_path):
    args = shlex.split(command.replace("$PWD", str(REPO)))[1:]  # the words after `snakemake`
    args = [str(REPO / a) if a.startswith("config/") else a for a in args]
    output = snakemake(*args, workdir=tmp_path).output
    lines = output[output.index("Plan for ") :].splitlines()
    # the plan's lines: its heading, then every line indented under it
    end = next((i for i, line in enumerate(lines) if i and not line.startswith("  ")), len(lines))
    assert without_the_machine("\n".join(lines[:end])) == without_the_machine(shown)


def test_cluster_md_quotes_the_anchor_plan_of_plan_md():
    """docs/cluster.md's table of the 600K plan: every time and GPU-hours figure is one the
    plan in docs/plan.md prints (that one is checked against the code above)."""
    text = (REPO / "docs" / "cluster.md").read_text()
    section = text[re.search(r"^## (?:\d+\. )?The plan at anchor scale", text, re.M).start() :]
    quoted = re.findall(r">= [\d,.]+(?: h| min)?", section.split("\n\n")[2])
    _, shown = documented_plans()[1]
    assert len(quoted) == 8 and all(figure in shown for figure in quoted), quoted


@pytest.mark.slow  # the snakemake CLI in a subprocess
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


@pytest.mark.slow  # the snakemake CLI in a subprocess
def test_a_too_small_disk_stops_a_real_run_before_synth(kimi, tmp_path):
    # more prompts than any disk holds the hidden states of, whatever this machine has free
    proc = dry_run(
        tmp_path,
        "kimi-k2.5.yaml",
        f"target={{path: {kimi}}}",
        "prompts={train: [{source: sharegpt, n: 1000000000}]}",
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
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda p: usage._replace(free=free["bytes"]))
    assert planlib.make_plan(cfg, tmp_path / "llama-8b")["problems"] == []
    free["bytes"] = 10 * GIB
    plan = planlib.make_plan(cfg, tmp_path / "llama-8b")
    (problem,) = plan["problems"]
    assert problem["check"] == "disk" and "Free " in problem["message"]
    assert planlib.refusals(plan, cfg) == [problem["message"]]
    cfg["plan"]["allow"] = ["disk"]
    assert planlib.refusals(plan, cfg) == []
    # the extract job's check is the same code: refuses, or warns with the override
    with pytest.raises(disk.DiskBudgetError, match=r"plan.allow: \[disk\]"):
        disk.check_disk(tmp_path, 20 * GIB, 1.2)
    assert disk.check_disk(tmp_path, 20 * GIB, 1.2, allow=True)["free_bytes"] == 10 * GIB


def test_weights_larger_than_the_gpus_at_the_tp_size(kimi, tmp_path):
    cfg = profile("kimi-k2.5", kimi, vllm={"tensor_parallel_size": 4, "gpu_memory_gib": 80})
    plan = planlib.make_plan(cfg, tmp_path / "kimi")
    msg = next(p["message"] for p in plan["problems"] if p["check"] == "gpu_memory")
    assert "138.3 GiB per GPU at vllm.tensor_parallel_size: 4" in msg
    assert "at least 8" in msg and "plan.allow" in msg
    ok = profile("kimi-k2.5", kimi, vllm={"gpu_memory_gib": 141})  # H200, TP 8
    assert "gpu_memory" not in {p["check"] for p in planlib.make_plan(ok, tmp_path)["problems"]}


def test_synth_servers_sharing_a_gpu_must_each_hold_the_weights(llama, tmp_path):
    """8 servers on an 80 GiB GPU get 0.9/8 of it each, 9 GiB: less than 15 GiB of weights."""
    cfg = profile("llama-8b", llama, synth={"servers_per_gpu": 8}, vllm={"gpu_memory_gib": 80})
    plan = planlib.make_plan(cfg, tmp_path / "llama")
    (msg,) = [p["message"] for p in plan["problems"] if p["check"] == "gpu_memory"]
    assert "each with 0.9/8 of its 80 GiB = 9.0 GiB" in msg and "at most 4" in msg
    cfg = profile("llama-8b", llama, synth={"servers_per_gpu": 4}, vllm={"gpu_memory_gib": 80})
    plan = planlib.make_plan(cfg, tmp_path / "llama")
    assert "gpu_memory" not in {p["check"] for p in plan["problems"]}
    assert plan["gpu_memory"]["synth_server_share"] == pytest.approx(0.9 / 4)


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


@pytest.mark.slow  # the snakemake CLI in a subprocess
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


@pytest.mark.slow  # the snakemake CLI in a subprocess
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


@pytest.mark.slow  # the snakemake CLI in a subprocess
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
