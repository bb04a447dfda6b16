"""The GPU host's steps (lab/gpu/steps.sh) plan what they are meant to run.

A lane of that plan is a Snakemake call in a shell function; a wrong word order there costs a
whole host run (Snakemake's ``--resources`` once took the targets as resources and every train
and bench lane failed in 3 s). Each step is called here as the host calls it, with ``SMK_FLAGS=-n``:
a dry run of the methods configs on a copy of the workflow.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3_pipeline import config as cfglib

from smkcli import REPO, copy_repo, job_names, parse_jobs

EAGLE3 = {"train[method=eagle3]", "bench[method=eagle3]"}
DFLASH = {"train[method=dflash]", "bench[method=dflash]"}


@pytest.fixture(scope="module")
def host_copy(tmp_path_factory) -> Path:
    root = copy_repo(tmp_path_factory.mktemp("host"))
    (root / "lab" / "gpu").mkdir(parents=True)
    shutil.copy2(REPO / "lab" / "gpu" / "steps.sh", root / "lab" / "gpu")
    shutil.copy2(REPO / "lab" / "drafter_speed.py", root / "lab")
    shutil.copytree(REPO / "lab" / "configs", root / "lab" / "configs")
    return root


SMALL = {
    "METHODS_EXTRA": "lab/configs/gpu_methods_2500.yaml",
    "METHODS_RUN": "gpu-methods-2500",
}


def call_step(root: Path, tmp_path: Path, step: str, env: dict | None = None) -> str:
    # the steps a lane waits for have finished
    (tmp_path / "status.log").write_text("m_data ok 1 s\nm_baseline ok 1 s\nqp_data ok 1 s\n")
    env = {
        **os.environ,
        "W": str(tmp_path),
        "SMK_FLAGS": "-n",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(root / "src"),
        **(env or {}),
    }
    proc = subprocess.run(
        ["bash", "-c", f"source lab/gpu/steps.sh && {step}"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def check_plan(out: str, step: str, planned: set, not_planned: set) -> set[str]:
    """The jobs a step's dry run planned: every one of ``planned``, none of ``not_planned``."""
    jobs = set(job_names(parse_jobs(out)))
    assert planned <= jobs, (step, sorted(jobs))
    assert not (not_planned & jobs), (step, sorted(jobs))
    return jobs


@pytest.mark.parametrize(
    ("step", "planned", "not_planned"),
    [
        (
            "m_data",
            {"synth_gather", "extract_gather", "vocab", "prompts_bench[name=mtbench]"},
            {"bench_baseline"} | EAGLE3 | DFLASH,
        ),
        ("m_train_eagle3", {"train[method=eagle3]"}, {"bench_baseline"} | DFLASH),
        ("m_bench_eagle3", EAGLE3, DFLASH),
        ("m_baseline", {"bench_baseline"}, EAGLE3 | DFLASH),
        ("m_train_dflash", {"train[method=dflash]"}, {"bench_baseline"} | EAGLE3),
        ("m_bench_dflash", DFLASH, EAGLE3),
        ("m_report", {"report"} | EAGLE3 | DFLASH, set()),
    ],
)
def test_each_lane_step_plans_its_own_jobs(host_copy, tmp_path, step, planned, not_planned):
    check_plan(call_step(host_copy, tmp_path, step), step, planned, not_planned)


@pytest.mark.parametrize(
    ("step", "planned", "not_planned"),
    [
        (
            "m_data",
            {"synth_gather", "extract_gather", "vocab"},
            {"bench_baseline"} | EAGLE3 | DFLASH,
        ),
        ("m_train_eagle3", {"train[method=eagle3]"}, {"bench_baseline"} | DFLASH),
        ("m_train_dflash", {"train[method=dflash]"}, {"bench_baseline"} | EAGLE3),
    ],
)
def test_a_run_named_by_an_extra_config_file(host_copy, tmp_path, step, planned, not_planned):
    """METHODS_EXTRA/METHODS_RUN: the 2,500-sample run, its own results directory."""
    out = call_step(host_copy, tmp_path, step, SMALL)
    check_plan(out, step, planned, not_planned)
    assert "results/gpu-methods-2500/" in out and "results/gpu-methods/" not in out


def test_the_speed_step_plans_every_server_of_the_run(host_copy, tmp_path):
    out = call_step(host_copy, tmp_path, "m_speed", {**SMALL, "SPEED_FLAGS": "--plan"})
    servers = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
    assert list(servers)[:4] == ["baseline", "eagle3-k3", "dflash-k3", "dflash-k15"]
    assert servers["dflash-k15"][0] == "results/gpu-methods-2500/drafter/dflash"
    assert servers["prompt"] == ["sets:", "mtbench", "humaneval", "heldout"]
    # the four servers fit on the GPU beside two trainings
    assert " ".join(servers["vllm"]) == '["--gpu-memory-utilization", "0.12"]'


@pytest.mark.parametrize(
    ("step", "run", "temperature"),
    [("q_synth_t0", "gpu-quality", "0.0"), ("q_synth_t1", "gpu-quality-t1", "1.0")],
)
def test_the_two_synth_lanes_write_their_own_runs(host_copy, tmp_path, step, run, temperature):
    """Greedy and sampled synth side by side: each lane plans synth and nothing after it, in a
    results directory of its own (a shared one would make the lanes overwrite each other)."""
    out = call_step(host_copy, tmp_path, step)
    jobs = set(job_names(parse_jobs(out)))
    assert {"synth[part=0]", "synth_gather"} <= jobs, sorted(jobs)
    assert not jobs & {"prepare", "extract_gather", "vocab"}, sorted(jobs)
    assert f"results/{run}/synth/" in out
    other = {"gpu-quality": "gpu-quality-t1", "gpu-quality-t1": "gpu-quality"}[run]
    assert f"results/{other}/" not in out
    files = ["config/gpu-quality.yaml"] + ["lab/configs/gpu_quality_t1.yaml"] * step.endswith("t1")
    cfg = cfglib.load_files([host_copy / f for f in files])
    assert str(cfg["synth"]["temperature"]) == temperature and cfg["run"] == run


def test_the_on_policy_synth_lane_answers_in_its_own_run(host_copy, tmp_path):
    """On-policy answers go to a run of their own (their later turns differ from the greedy
    run's), and the lane stops after synth: the journal is what is copied off."""
    out = call_step(host_copy, tmp_path, "q_synth_on_policy")
    jobs = set(job_names(parse_jobs(out)))
    assert {"synth[part=0]", "synth_gather"} <= jobs, sorted(jobs)
    assert not jobs & {"prepare", "extract_gather", "vocab"}, sorted(jobs)
    assert "results/gpu-quality-on-policy/synth/" in out
    assert "results/gpu-quality/" not in out
    levers = ("levers", "on_policy")
    files = ["config/gpu-quality.yaml", *(f"lab/configs/gpu_quality_{x}.yaml" for x in levers)]
    cfg = cfglib.load_files([host_copy / f for f in files])
    assert cfg["synth"]["context"] == "on_policy" and cfg["synth"]["temperature"] == 0.0


@pytest.mark.parametrize(
    ("step", "run"),
    [
        ("q_train_t0", "gpu-quality"),
        ("q_train_t1", "gpu-quality-t1"),
    ],
)
def test_the_lever_lanes_train_eagle3_only_and_benchmark_nothing(host_copy, tmp_path, step, run):
    """The two quality runs trained side by side: data and EAGLE-3's training of their own
    run, no DFlash (the levers config drops it) and no bench job (measured off the host)."""
    out = call_step(host_copy, tmp_path, step)
    jobs = set(job_names(parse_jobs(out)))
    assert {"synth_gather", "extract_gather", "vocab", "train[method=eagle3]"} <= jobs, sorted(jobs)
    assert not {j for j in jobs if j.startswith("bench") or "dflash" in j}, sorted(jobs)
    assert f"results/{run}/drafter/eagle3" in out


@pytest.mark.parametrize(
    ("step", "planned", "not_planned"),
    [
        ("qp_data", {"synth_gather", "extract_gather", "vocab"}, {"train[method=eagle3]"}),
        ("qp_train_eagle3", {"train[method=eagle3]"}, {"train[method=eagle3_ttt4]"}),
        ("qp_train_ttt4", {"train[method=eagle3_ttt4]"}, {"train[method=eagle3]"}),
    ],
)
def test_the_on_policy_drafters_train_in_lanes_of_their_own(
    host_copy, tmp_path, step, planned, not_planned
):
    """TTT depth 3 and 4 from the on-policy run's one extraction, each in its own lane, and
    no bench job (their acceptance is measured by qp_tau); the variant differs in its depth."""
    out = call_step(host_copy, tmp_path, step)
    jobs = check_plan(out, step, planned, not_planned)
    assert not {j for j in jobs if j.startswith("bench")}, sorted(jobs)
    assert "results/gpu-quality-on-policy/" in out
    levers = ("levers", "on_policy", "ttt4")
    files = ["config/gpu-quality.yaml", *(f"lab/configs/gpu_quality_{x}.yaml" for x in levers)]
    cfg = cfglib.load_files([host_copy / f for f in files])
    ttt = {m: cfglib.drafter_train_config(cfg, m)["ttt_steps"] for m in cfg["train"]["methods"]}
    assert ttt == {"eagle3": 3, "eagle3_ttt4": 4}


def test_the_online_rounds_config_trains_online_on_the_one_gpu(host_copy, tmp_path):
    """The host has one GPU: online, the extraction server shares the trainer's (a GPU of its
    own would make the train job ask for two, refused before any job)."""
    from smkcli import plan

    files = [
        "config/gpu-quality.yaml",
        "lab/configs/gpu_quality_levers.yaml",
        "lab/configs/gpu_quality_on_policy.yaml",
        "lab/configs/gpu_online_rounds.yaml",
    ]
    args = ("--configfile", *(str(host_copy / f) for f in files), "--resources", "gpus=1")
    jobs = plan(*args, "--config", "extract={mode: online}", repo=host_copy, workdir=tmp_path)
    assert {j.gpus for j in jobs if j.rule == "train"} == {1}
    assert not [j for j in jobs if j.rule.startswith("extract")]
    jobs = plan(*args, "--config", "extract={mode: stored}", repo=host_copy, workdir=tmp_path)
    assert {j.rule for j in jobs} >= {"extract", "train"}
    cfg = cfglib.load_files([host_copy / f for f in files])
    assert cfg["run"] == "gpu-online-rounds" and cfg["prompts"]["train"][0]["n"] == 4000


def test_the_online_steps_read_the_on_policy_runs_configs(host_copy, tmp_path):
    """online_prep's config files are the on-policy run's and the online-rounds one, in that
    order: the on-policy answers are the data the rounds train on."""
    out = call_step(host_copy, tmp_path, 'online_prep && printf "%s\\n" "${ONLINE_CFG[@]}"')
    assert out.split() == [
        "lab/configs/gpu_quality_levers.yaml",
        "lab/configs/gpu_quality_on_policy.yaml",
        "lab/configs/gpu_online_rounds.yaml",
    ]


def test_the_online_smoke_step_trains_online_on_a_few_rows(host_copy, tmp_path):
    """online_smoke: one online training (no extract job) on ONLINE_PROMPTS rows of the
    online-rounds run."""
    out = call_step(host_copy, tmp_path, "online_smoke", {"ONLINE_PROMPTS": "120"})
    jobs = check_plan(out, "online_smoke", {"train[method=eagle3]"}, {"extract_gather"})
    assert not {j for j in jobs if j.startswith(("extract", "bench"))}, sorted(jobs)
    assert "results/gpu-online-rounds/drafter/eagle3" in out
    assert "n: 120," in (tmp_path / "online_prompts.yaml").read_text()


BLOCKS = {
    "METHODS_EXTRA": "lab/configs/gpu_methods_blocks.yaml",
    "METHODS_RUN": "gpu-methods-blocks",
}
B8 = {"train[method=dflash_b8]", "bench[method=dflash_b8]"}


@pytest.mark.parametrize(
    ("step", "planned", "not_planned"),
    [
        ("m_train_eagle3", {"train[method=eagle3]"}, DFLASH | B8),
        ("m_train_dflash", {"train[method=dflash]"}, EAGLE3 | B8),  # (under nice)
        ("m_train_dflash_b8", {"train[method=dflash_b8]"}, EAGLE3 | DFLASH),
        ("m_report", {"report"} | EAGLE3 | DFLASH | B8, set()),
    ],
)
def test_the_block_size_run_trains_the_variant_in_a_lane_of_its_own(
    host_copy, tmp_path, step, planned, not_planned
):
    """The block-size run: DFlash at block 16 and its block-8 variant beside EAGLE-3."""
    out = call_step(host_copy, tmp_path, step, BLOCKS)
    check_plan(out, step, planned, not_planned)
    assert "results/gpu-methods-blocks/" in out


def test_the_speed_step_of_the_block_size_run_serves_each_drafter_at_its_k(host_copy, tmp_path):
    out = call_step(host_copy, tmp_path, "m_speed", {**BLOCKS, "SPEED_FLAGS": "--plan"})
    servers = [line.split()[0] for line in out.splitlines() if line.strip()]
    assert servers[:4] == ["baseline", "eagle3-k3", "dflash-k15", "dflash_b8-k7"]
    assert "results/gpu-methods-blocks/drafter/dflash_b8" in out


def test_a_server_whose_start_raises_is_reported_failed(tmp_path, monkeypatch):
    """A starting thread's exception would vanish with the thread (on the H200 a lazy-import
    race in transformers lost a server so, and the run still said ok): it is the server's error."""
    import importlib.util
    import time

    spec = importlib.util.spec_from_file_location(
        "drafter_speed", REPO / "lab" / "drafter_speed.py"
    )
    speed = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "drafter_speed", speed)  # dataclasses look it up
    spec.loader.exec_module(speed)
    drafter = tmp_path / "drafter" / "dflash"
    drafter.mkdir(parents=True)
    (drafter / "metrics.json").write_text("{}")  # trained, but no config.json: check() raises
    servers = [speed.Server("dflash", k, {}, drafter_dir=drafter) for k in (3, 15)]
    deadline = time.monotonic() + 30
    with speed.Starter(servers, {}, {}, {}, tmp_path, deadline, stagger_s=0) as starter:
        starter.wait_all()
    assert all(s.server is None and s.error for s in servers), [s.error for s in servers]
    assert all("config.json" in s.error for s in servers), [s.error for s in servers]


def load_script(name: str, path: Path, monkeypatch):
    import importlib.util

    monkeypatch.syspath_prepend(str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def test_a_slim_drafter_comes_home_in_parts_and_gets_its_embeddings_back(tmp_path, monkeypatch):
    """A drafter packed without its frozen embeddings (pack_results --slim) is put back
    byte for byte from the target; a target whose embeddings differ is refused."""
    import subprocess

    import torch
    from safetensors.torch import load_file, save_file

    gpu = REPO / "lab" / "gpu"
    pack = load_script("pack_results", gpu / "pack_results.py", monkeypatch)
    host = tmp_path / "host"
    drafter = host / "repo" / "results" / "r" / "drafter" / "eagle3"
    drafter.mkdir(parents=True)
    embed = torch.randn(4096, 64).to(torch.bfloat16)  # 512 KiB
    weights = {"embed_tokens.weight": embed, "fc.weight": torch.randn(64, 192)}  # 48 KiB
    save_file(weights, drafter / "model.safetensors")
    (drafter / "config.json").write_text('{"embed_requires_grad": false}')
    (host / "repo" / "results" / "r" / "drafter" / "dflash").mkdir()
    monkeypatch.setattr(pack, "LIMIT", 16 << 10)  # parts of 16 KiB: several
    (tmp_path / "out").mkdir()
    pack.main(str(host), str(tmp_path / "out" / "results.tar.xz"), [], ["r:eagle3"], slim=True)
    parts = sorted((tmp_path / "out").glob("r-drafters-eagle3.tar.part*"))
    assert len(parts) > 1
    assert sum(p.stat().st_size for p in parts) < embed.numel() * 2  # the embeddings stayed

    model = tmp_path / "target"
    model.mkdir()
    save_file({"model.embed_tokens.weight": embed.float()}, model / "model.safetensors")
    unpack = [sys.executable, str(gpu / "unpack_drafters.py"), *map(str, parts)]
    home = tmp_path / "home"
    subprocess.run([*unpack, "--into", str(home), "--target-model", str(model)], check=True)
    back = load_file(home / "results" / "r" / "drafter" / "eagle3" / "model.safetensors")
    assert torch.equal(back["embed_tokens.weight"], embed)
    assert torch.equal(back["fc.weight"], weights["fc.weight"])
    assert not list(home.rglob("*.embed.json"))

    save_file({"model.embed_tokens.weight": embed.float() + 1}, model / "model.safetensors")
    other = subprocess.run(
        [*unpack, "--into", str(tmp_path / "h2"), "--target-model", str(model)],
        capture_output=True,
        text=True,
    )
    assert other.returncode != 0 and "is not the one this drafter was trained with" in other.stderr


ROUNDS = {
    "METHODS_EXTRA": "lab/configs/gpu_methods_rounds.yaml",
    "METHODS_RUN": "gpu-methods-rounds",
}


@pytest.mark.parametrize(
    ("step", "planned", "not_planned"),
    [
        ("m_data", {"synth_gather", "extract_gather", "vocab"}, EAGLE3 | DFLASH | B8),
        ("m_train_eagle3", {"train[method=eagle3]"}, DFLASH | B8),
        ("m_train_dflash_b8", {"train[method=dflash_b8]"}, EAGLE3 | DFLASH),
    ],
)
def test_the_methods_rounds_run_trains_eagle3_and_block_8_only(
    host_copy, tmp_path, step, planned, not_planned
):
    jobs = check_plan(call_step(host_copy, tmp_path, step, ROUNDS), step, planned, not_planned)
    assert not {j for j in jobs if j.startswith("bench")}, sorted(jobs)


def echo_python(tmp_path: Path) -> dict:
    """PATH with a python3 that prints its arguments, one call a line."""
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "python3").write_text('#!/bin/sh\necho "$@"\n')
    (stub / "python3").chmod(0o755)
    return {"PATH": f"{stub}{os.pathsep}{os.environ['PATH']}"}


def test_the_rounds_step_times_both_drafters_against_one_baseline(host_copy, tmp_path):
    """m_rounds hands both drafters of the run, each at its k, to one drafter_tau --speed."""
    run = "results/gpu-methods-rounds"
    made = [host_copy / run / f for f in ("target/target.json", "prompts/bench_heldout.jsonl")]
    made += [host_copy / run / "drafter" / d / "model.safetensors" for d in ("eagle3", "dflash_b8")]
    try:
        for f in made:  # trained on this host
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text("")
        env = {**ROUNDS, **echo_python(tmp_path)}
        out = call_step(host_copy, tmp_path, "m_rounds", env)
        # MT-Bench only, so that data, trainings and rounds fit one host
        mtbench_only = call_step(host_copy, tmp_path, "m_rounds", {**env, "M_ROUNDS_HELDOUT": "0"})
    finally:
        shutil.rmtree(host_copy / run)
    (call,) = out.splitlines()  # no target made, no drafter unpacked
    args = call.split()
    assert args[:2] == ["lab/drafter_tau.py", "--configfile"] and "--speed" in args
    drafters = [args[i + 1] for i, a in enumerate(args) if a == "--drafter"]
    assert drafters == [f"eagle3:3={run}/drafter/eagle3", f"dflash:7={run}/drafter/dflash_b8"]
    assert args[args.index("--heldout") + 1] == f"{run}/prompts/bench_heldout.jsonl"
    assert args[args.index("--mtbench") + 1] == "80"
    (call,) = mtbench_only.splitlines()
    args = call.split()
    assert "--heldout" not in args and args[args.index("--mtbench") + 1] == "80"
    assert [args[i + 1] for i, a in enumerate(args) if a == "--drafter"] == drafters


def test_the_rounds_step_puts_a_carried_drafter_back_first(host_copy, tmp_path):
    """On a later host: the run's target made, the carried drafter's parts unpacked onto it,
    the held-out set the committed run's; a drafter neither here nor carried stops the step."""
    env = {**ROUNDS, **echo_python(tmp_path), "M_ROUNDS_DRAFTERS": "dflash:7=dflash_b8"}
    parts = tmp_path / "drafters"
    parts.mkdir()
    (parts / "gpu-methods-rounds-drafters-dflash_b8.tar.part00").write_text("")
    calls = call_step(host_copy, tmp_path, "m_rounds", env).splitlines()
    assert calls[0].startswith("-m snakemake") and "--until target" in calls[0]
    run = "results/gpu-methods-rounds"
    unpack = calls[1].split()
    assert unpack[:3] == ["lab/gpu/unpack_drafters.py", "--into", "."]
    assert unpack[3:5] == ["--target-model", f"{run}/target/model"]
    assert unpack[5:] == [str(parts / "gpu-methods-rounds-drafters-dflash_b8.tar.part00")]
    args = calls[2].split()
    assert [args[i + 1] for i, a in enumerate(args) if a == "--drafter"] == [
        f"dflash:7={run}/drafter/dflash_b8"
    ]
    committed = "benchmarks/results/gpu_runs/gpu-methods-rounds/prompts/bench_heldout.jsonl"
    assert args[args.index("--heldout") + 1] == committed

    env["M_ROUNDS_DRAFTERS"] = "eagle3:3=eagle3"  # neither trained here nor carried
    proc = subprocess.run(
        ["bash", "-c", "source lab/gpu/steps.sh && m_rounds"],
        cwd=host_copy,
        env={**os.environ, "W": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "no parts of it" in proc.stderr
    assert "drafter_tau" not in proc.stdout


def test_the_on_policy_tau_step_measures_a_drafter_on_both_mtbench_sets(host_copy, tmp_path):
    """qp_tau: the run's own target and held-out set, T = 0 and 1, MT-Bench also with its
    second turns; it says whether the held-out set is the greedy drafter's."""
    run = "results/gpu-quality-on-policy"
    made = [host_copy / run / f for f in ("target/target.json", "drafter/eagle3/model.safetensors")]
    heldout = host_copy / run / "prompts" / "bench_heldout.jsonl"
    greedy = "benchmarks/results/gpu_runs/quality-train-t0/gpu-quality/prompts/bench_heldout.jsonl"
    try:
        for f in made:
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text("")
        heldout.parent.mkdir(parents=True)
        shutil.copy2(REPO / greedy, heldout)
        (host_copy / greedy).parent.mkdir(parents=True)  # (the host has the whole checkout)
        shutil.copy2(REPO / greedy, host_copy / greedy)
        out = call_step(host_copy, tmp_path, "qp_tau_eagle3", echo_python(tmp_path))
    finally:
        shutil.rmtree(host_copy / run)
        shutil.rmtree(host_copy / "benchmarks" / "results", ignore_errors=True)
    said, call = out.splitlines()
    assert said == "held-out set: the greedy 19k drafter's"
    args = call.split()
    assert args[0] == "lab/drafter_tau.py" and "--speed" not in args
    assert args[args.index("--target-json") + 1] == f"{run}/target/target.json"
    assert args[args.index("--heldout") + 1] == f"{run}/prompts/bench_heldout.jsonl"
    assert args[args.index("--mtbench-turns") + 1] == "2"
    t = args.index("--temperatures")
    assert args[t + 1 : t + 3] == ["0", "1"] and args[t + 3].startswith("--")
    assert args[args.index("--drafter") + 1] == f"eagle3:3={run}/drafter/eagle3"
    assert args[-1].endswith("/bench/h200_quality_on_policy_eagle3_tau.json")


def test_the_on_policy_speed_step_puts_the_carried_drafter_back(host_copy, tmp_path):
    parts = tmp_path / "drafters"
    parts.mkdir()
    (parts / "gpu-quality-on-policy-drafters-eagle3_ttt4.tar.part00").write_text("")
    env = {**echo_python(tmp_path), "QP_SPEED_DRAFTER": "eagle3_ttt4"}
    calls = call_step(host_copy, tmp_path, "qp_speed", env).splitlines()
    run = "results/gpu-quality-on-policy"
    assert calls[0].startswith("-m snakemake") and "--until target" in calls[0]
    assert calls[1].split()[:5] == [
        "lab/gpu/unpack_drafters.py", "--into", ".", "--target-model", f"{run}/target/model"
    ]  # fmt: skip
    args = calls[2].split()
    assert "--speed" in args and args[args.index("--drafter") + 1] == (
        f"eagle3:3={run}/drafter/eagle3_ttt4"
    )
    greedy = "benchmarks/results/gpu_runs/quality-train-t0/gpu-quality/prompts/bench_heldout.jsonl"
    assert args[args.index("--heldout") + 1] == greedy
    assert args[-1].endswith("h200_quality_on_policy_eagle3_ttt4_speed_t0.json")


def _poll(tmp_path: Path, *args: str) -> subprocess.Popen:
    plan = subprocess.Popen(["sleep", "60"])  # stands in for the running plan
    (tmp_path / "plan.pid").write_text(str(plan.pid))
    (tmp_path / "status.log").write_text("m_data start 13:35:11\n")
    poll = subprocess.Popen(
        ["bash", str(REPO / "lab" / "gpu" / "h200.sh"), "poll", *args],
        env={**os.environ, "W": str(tmp_path)},
        stdout=subprocess.PIPE,
        text=True,
    )
    poll.plan = plan
    return poll


@pytest.mark.parametrize("ending", ["m_data ok 274 s", "m_data FAIL rc=1 12 s"])
def test_poll_returns_when_a_step_ends_if_asked(tmp_path, ending):
    poll = _poll(tmp_path, "40", "--step-end")
    try:
        time.sleep(6)
        assert poll.poll() is None  # nothing ended yet: still waiting
        with open(tmp_path / "status.log", "a") as f:
            f.write(ending + "\nm_train start 13:39:45\n")
        out, _ = poll.communicate(timeout=15)
        assert "== running" in out and ending in out
    finally:
        poll.kill()
        poll.plan.kill()


def test_poll_without_step_end_waits_past_a_step(tmp_path):
    poll = _poll(tmp_path, "12")
    try:
        time.sleep(2)
        with open(tmp_path / "status.log", "a") as f:
            f.write("m_data ok 274 s\n")
        t0 = time.monotonic()
        out, _ = poll.communicate(timeout=30)
        assert time.monotonic() - t0 > 6 and "== running" in out
    finally:
        poll.kill()
        poll.plan.kill()
