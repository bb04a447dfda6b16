"""Plans of other settings, through the snakemake CLI (the full tier: `pytest --full`): GPU
resources and tensor parallelism, the production profiles, the Slurm profile's submit commands,
synth split into parts, a failed job, several drafter methods and variants, and extract.mode
online. The quick tier's staleness matrix on the default config is tests/test_workflow.py.

Every test is a dry run (or a `--touch` run) in a temporary directory: no stage code runs and
neither models nor vLLM are needed. What they prove and what they do not is said test by test.
"""

from __future__ import annotations

import collections
import json
import os
import time
from pathlib import Path

import humanfriendly
import pytest
import yaml
from test_workflow import CUDA_TP8, DEFAULT_CONFIG, by_rule, code_closures, edited, real_change

from smkcli import (
    REPO,
    STAGES,
    copy_repo,
    downstream,
    job_names,
    mark_done,
    plan,
    rerun_plan,
    sbatch_flag,
    slurm_calls,
    snakemake,
)

# each test plans (or marks done) with snakemake subprocesses of its own: ~3 s of CPU each
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fake_model_dir(tmp_path_factory) -> Path:
    """Stands in for a local model: the config check only wants a directory with config.json,
    a tokenizer and a chat template (no job reads them here)."""
    d = tmp_path_factory.mktemp("fake-model")
    (d / "config.json").write_text("{}")
    (d / "tokenizer.json").write_text("{}")
    (d / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    return d


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_throughput_measurement_runs_alone(tmp_path, device):
    """A speed measurement beside another job measures the contention: the baseline beside
    synth, a drafter beside a training (GPU jobs share the host's CPUs, CPU jobs its cores).
    So the bench jobs take every core on any device, and Snakemake runs nothing beside them.
    Other vLLM jobs take every core on the CPU (their servers compute there), one on GPUs."""
    jobs = plan(
        "--configfile",
        DEFAULT_CONFIG,
        "--cores",
        "2",
        "--config",
        f"vllm={{device: {device}}}",
        "train={methods: [eagle3, dflash]}",
        "bench={pairing: separate}",
        workdir=tmp_path,
    )
    threads = {j.rule: int(j.fields.get("threads", 1)) for j in jobs}
    for rule in ("bench_baseline", "bench"):
        assert threads[rule] == 2, (rule, threads[rule])
    for rule in ("synth", "extract"):
        assert threads[rule] == (2 if device == "cpu" else 1), (rule, threads[rule])


# ---- GPU scheduling ------------------------------------------------------------------------


def plan_tp8(workdir, *config: str):
    """The default config on GPUs at tensor parallelism 8 (``CUDA_TP8``) and ``config``
    planned with 8 GPUs."""
    return plan(
        "--configfile",
        DEFAULT_CONFIG,
        "--resources",
        "gpus=8",
        "--config",
        CUDA_TP8,
        *config,
        workdir=workdir,
    )


def test_cuda_config_asks_tensor_parallel_gpus(tmp_path):
    jobs = plan_tp8(tmp_path)
    gpus = {j.rule: j.gpus for j in jobs}
    assert gpus == {
        "target": 0,
        "prompts_train": 0,
        "prompts_bench": 0,
        "synth": 8,
        "synth_gather": 0,
        "prepare": 0,
        "vocab": 0,
        "extract": 8,
        "extract_gather": 0,
        "train": 8,  # train.gpus: auto is the tensor-parallel size on GPUs
        "bench": 8,
        "report": 0,
        "all": 0,
    }
    # the same count under the slurm plugin's resource name
    assert {j.rule: int(j.resources.get("gpu", 0)) for j in jobs} == gpus


def test_resources_below_tensor_parallel_size_fail_before_any_job(tmp_path):
    # Snakemake would silently scale the jobs down to 4 GPUs; the workflow refuses instead.
    proc = snakemake(
        "-n",
        "--configfile",
        DEFAULT_CONFIG,
        "--resources",
        "gpus=4",
        "--config",
        CUDA_TP8,
        workdir=tmp_path,
        check=False,
    )
    assert proc.returncode != 0
    assert "--resources gpus=4 is less than rule synth needs 8" in proc.output
    assert "pass at least --resources gpus=8" in proc.output
    assert "Building DAG of jobs" not in proc.output


@pytest.mark.parametrize("resources, note", [((), True), (("--resources", "gpus=8"), False)])
def test_onstart_note_without_resources(tmp_path, resources, note):
    # A real (non-dry) run is needed for onstart: --touch runs the hook without running jobs
    # (outputs that do not exist are just reported as not touched).
    proc = snakemake(
        "--touch",
        "--cores",
        "1",
        "--configfile",
        DEFAULT_CONFIG,
        *resources,
        "--config",
        CUDA_TP8,
        workdir=tmp_path,
    )
    assert ("NOTE: no --resources gpus=N given" in proc.output) is note


def test_sdm_conda_requires_unblocked_pythonpath(tmp_path):
    # The jobs import the library through PYTHONPATH, which conda jobs lose without the flag
    # (profiles/default sets it; `--workflow-profile none` drops that profile).
    proc = snakemake(
        "-n",
        "--configfile",
        DEFAULT_CONFIG,
        "--workflow-profile",
        "none",
        "--sdm",
        "conda",
        workdir=tmp_path,
        check=False,
    )
    assert proc.returncode != 0
    assert "--sdm conda needs --conda-not-block-search-path-envvars" in proc.output


# ---- production profiles -------------------------------------------------------------------


def test_kimi_profile_plans_whole_chain_with_one_tp8_extraction(tmp_path, fake_model_dir):
    jobs = plan(
        "--configfile",
        str(REPO / "config" / "kimi-k2.5.yaml"),
        "--resources",
        "gpus=8",
        "--config",
        f"target={{path: {fake_model_dir}}}",
        workdir=tmp_path,
    )
    assert by_rule(jobs) == {s: 1 for s in (*STAGES, "all")} | {"prompts_bench": 2}
    gpus = {j.rule: j.gpus for j in jobs}
    assert gpus["extract"] == gpus["synth"] == gpus["bench"] == gpus["train"] == 8
    # two TP=8 servers do not fit on one node: the baseline is measured on its own
    assert gpus["bench_baseline"] == 8
    assert all(
        gpus[s] == 0
        for s in (
            "target",
            "prompts_train",
            "prompts_bench",
            "prepare",
            "vocab",
            "extract_gather",
            "report",
        )
    )
    assert all("results/kimi-k2.5/" in j.fields.get("output", "results/kimi-k2.5/") for j in jobs)


def test_kimi_profile_extraction_split_in_four(tmp_path, fake_model_dir):
    jobs = plan(
        "--configfile",
        str(REPO / "config" / "kimi-k2.5.yaml"),
        "--config",
        f"target={{path: {fake_model_dir}}}",
        "extract={jobs: 4}",
        workdir=tmp_path,
    )
    extract = [j for j in jobs if j.rule == "extract"]
    assert sorted(j.wildcards["part"] for j in extract) == ["0", "1", "2", "3"]
    assert all(j.gpus == 8 for j in extract)
    assert by_rule(jobs)["extract_gather"] == 1


def test_llama_profile_plans(tmp_path, fake_model_dir):
    jobs = plan(
        "--configfile",
        str(REPO / "config" / "llama-8b.yaml"),
        "--resources",
        "gpus=4",
        "--config",
        f"target={{path: {fake_model_dir}}}",
        workdir=tmp_path,
    )
    gpus = {j.rule: j.gpus for j in jobs}
    assert (gpus["synth"], gpus["extract"], gpus["bench"], gpus["train"]) == (1, 1, 1, 4)


def test_gpu_quality_profile_plans_both_methods_on_one_gpu(tmp_path):
    """The H200 quality run: EAGLE-3 and DFlash from one extraction, each on the GPU, against
    one baseline (planned here without a GPU; the config check is what a GPU host runs too)."""
    jobs = plan(
        "--configfile",
        str(REPO / "config" / "gpu-quality.yaml"),
        "--resources",
        "gpus=1",
        workdir=tmp_path,
    )
    gpus = {job_names([j])[0]: j.gpus for j in jobs if j.rule != "all"}
    for method in ("eagle3", "dflash"):
        assert gpus[f"train[method={method}]"] == gpus[f"bench[method={method}]"] == 1
    assert gpus["synth[part=0]"] == gpus["extract[part=0]"] == 1
    assert by_rule(jobs)["extract"] == 1 and by_rule(jobs)["train"] == 2
    assert "bench_baseline" not in by_rule(jobs)  # measured beside each drafter


# ---- Slurm -----------------------------------------------------------------------------------


SLURM_PROFILE = REPO / "profiles" / "slurm" / "config.yaml"


def workflow_rules() -> set[str]:
    """Every rule of the workflow (`snakemake --list-rules`: a name at the start of a line, its
    docstring after it), without the `all` target."""
    out = snakemake("--list-rules", "--configfile", DEFAULT_CONFIG).stdout
    return {line.split()[0] for line in out.splitlines() if line[:1].isalpha()} - {"all"}


def test_slurm_profile_names_every_rule():
    """A rule the profile does not name would run with the 1 h default wall time (and, CPU-only,
    with Snakemake's thread count as its CPUs): each must be sized on purpose."""
    resources = yaml.safe_load(SLURM_PROFILE.read_text())["set-resources"]
    assert set(resources) == workflow_rules()
    assert all("runtime" in r for r in resources.values()), resources


def test_slurm_profile_sizes_every_gpu_job(tmp_path, fake_model_dir):
    """Each GPU job of the Kimi-K2.5 profile asks for one node, its GPUs, the CPUs and memory
    that go with them and its own wall time from the profile. The GPU rules are the jobs that
    ask for GPUs in the plan, so a new GPU rule is checked without being listed here."""
    args = ("--configfile", str(REPO / "config" / "kimi-k2.5.yaml"), "--config")
    config = (f"target={{path: {fake_model_dir}}}", "extract={jobs: 2}")
    calls = slurm_calls(*args, *config, workdir=tmp_path)
    jobs = [j for j in plan(*args, *config, workdir=tmp_path) if j.rule != "all"]
    gpus = {j.rule: j.gpus for j in jobs}
    gpu_rules = {rule for rule, n in gpus.items() if n}
    assert {"synth", "extract", "train", "bench_baseline", "bench"} <= gpu_rules

    profile = yaml.safe_load(SLURM_PROFILE.read_text())
    default, per_rule = profile["default-resources"], profile["set-resources"]
    sbatch = collections.defaultdict(list)
    for c in calls:
        sbatch[c["rule"]].append(c["sbatch"])
    assert set(sbatch) == set(STAGES)
    assert len(sbatch["extract"]) == 2
    for rule, cmds in sbatch.items():
        assert "runtime" in per_rule.get(rule, {}), f"profiles/slurm sets no runtime for {rule}"
        minutes = humanfriendly.parse_timespan(per_rule[rule]["runtime"]) / 60
        for cmd in cmds:
            assert cmd.startswith("sbatch --parsable")
            assert " -A my_account " in cmd and " -p gpu " in cmd, cmd
            assert f"--comment rule_{rule}" in cmd
            assert sbatch_flag(cmd, r" -t (\d+) ") == minutes, cmd
            assert sbatch_flag(cmd, r"--nodes=(\d+)") == 1, cmd
            assert sbatch_flag(cmd, r"--mem-per-cpu (\d+)") == default["mem_mb_per_cpu"], cmd
            if rule in gpu_rules:
                assert sbatch_flag(cmd, r" --gpus=(\d+)$") == gpus[rule] == 8, cmd
                assert sbatch_flag(cmd, r"--cpus-per-gpu=(\d+)") == default["cpus_per_gpu"]
                assert "--ntasks" not in cmd and "--cpus-per-task" not in cmd, cmd
            else:
                assert "--gpus" not in cmd, cmd
                assert sbatch_flag(cmd, r"--cpus-per-task=(\d+)") == per_rule[rule]["cpus_per_task"]
    # the stages the wall times were sized for (profiles/slurm/config.yaml says how)
    assert sbatch_flag(sbatch["synth"][0], r" -t (\d+) ") == 48 * 60
    assert sbatch_flag(sbatch["bench_baseline"][0], r" -t (\d+) ") == 12 * 60


def test_slurm_profile_on_the_cpu_default_asks_no_gpus(tmp_path):
    calls = slurm_calls("--configfile", DEFAULT_CONFIG, workdir=tmp_path)
    assert {c["rule"] for c in calls} == set(STAGES) - {"bench_baseline"}  # bench pairs it
    assert not any("--gpus" in c["sbatch"] for c in calls)


def test_synth_jobs_are_parts_of_the_prompts_and_one_gather(tmp_path):
    """synth.jobs: 3 is three synth jobs, each holding the tensor-parallel GPUs of its own
    server, and one gather on no GPU that everything downstream reads."""
    jobs = plan_tp8(tmp_path, "synth={jobs: 3}")
    gpus = {job_names([j])[0]: j.gpus for j in jobs if j.rule != "all"}
    assert sorted(n for n in gpus if n.startswith("synth")) == [
        "synth[part=0]",
        "synth[part=1]",
        "synth[part=2]",
        "synth_gather",
    ]
    assert [gpus[f"synth[part={k}]"] for k in range(3)] == [8, 8, 8]
    assert gpus["synth_gather"] == 0


def test_a_failed_train_job_is_run_again_with_what_follows(tmp_path_factory):
    """A train job that failed after bench and report were made from the drafter it replaced
    (Snakemake removed the drafter when the job started and recorded the job): the same command
    again would find bench and report current and do nothing; the default target asks for the
    drafter again (staleness/interrupted.py; the mechanism with real failing jobs:
    tests/test_interrupted.py). An output deleted by hand forces nothing."""
    import time

    repo = copy_repo(tmp_path_factory.mktemp("repo"))
    mark_done(repo)
    drafter = "results/default/drafter/eagle3/model.safetensors"
    (repo / drafter).unlink()  # by hand: Snakemake's choice stands
    assert "Nothing to be done" in snakemake("-n", repo=repo).output
    # what a train job that starts (and then fails) leaves: its record, started now
    meta = repo / ".snakemake" / "metadata"
    for path in meta.rglob("*"):
        if path.is_file():
            data = json.loads(path.read_text())
            if data.get("rule") == "train":
                data["starttime"] = time.time()
                path.write_text(json.dumps(data))
    assert "rule(s) train run again" in snakemake("-n", repo=repo).output
    assert {"train", "bench", "report"} <= {j.rule for j in plan(repo=repo)}


def test_the_synth_context_replans_synth_and_downstream_and_notes_a_pool_of_single_turns(
    done_copy,
):
    """synth.context changes the messages sent and how prompts fall into parts: synth and
    everything after it re-run, the prompts do not. At its default it is not in the params
    (test_nothing_to_do_after_a_complete_run: a finished run stays finished). The default pool
    has single turns only, which on_policy asks the same: the plan says so, and runs."""
    jobs = rerun_plan(done_copy, "--config", "synth={context: on_policy}")
    assert set(jobs) == downstream({"synth"})
    assert jobs["synth"].startswith("Params have changed since last execution")
    assert "'context': 'on_policy'" in jobs["synth"]
    out = snakemake("-n", "--config", "synth={context: on_policy}", repo=done_copy).output
    assert "NOTE: config key `synth.context`: on_policy changes no request here" in out


def test_the_workflow_profile_turns_off_the_script_mtime_trigger(done_copy):
    """Snakemake's `code` trigger re-runs a script rule whenever the script is newer than its
    outputs; profiles/default (found beside the Snakefile, as in every test here) drops it, so
    a touched script re-runs nothing. Without the profile it would."""
    script = done_copy / "workflow_scripts" / "vocab.py"
    st = script.stat()
    try:
        # an hour after now, not after the script's own mtime: a checkout older than an hour
        # keeps its files' mtimes, and the script would still be older than the outputs
        later = time.time() + 3600
        os.utime(script, (later, later))
        assert "Nothing to be done" in snakemake("-n", repo=done_copy).output
        jobs = rerun_plan(done_copy, "--workflow-profile", "none")
        assert jobs["vocab"].startswith("Code has changed since last execution")
    finally:
        os.utime(script, (st.st_atime, st.st_mtime))


def test_a_local_targets_config_is_an_input(tmp_path, fake_model_dir):
    """Editing a local target's config.json re-runs target and what depends on it."""
    args = (
        "--configfile",
        DEFAULT_CONFIG,
        "--config",
        f"target={{source: local, path: {fake_model_dir}}}",
    )
    mark_done(REPO, *args, workdir=tmp_path)
    assert plan(*args, workdir=tmp_path) == []
    config = fake_model_dir / "config.json"
    st = config.stat()
    try:
        config.write_text('{"num_hidden_layers": 2}')
        jobs = {j.rule: j.reason for j in plan(*args, workdir=tmp_path)}
    finally:
        config.write_text("{}")
        os.utime(config, (st.st_atime, st.st_mtime))
    assert jobs["target"] == f"Updated input files: {config}"
    # the prompts' tokens are counted with the target's tokenizer and chat template
    assert {"prompts_train", "prompts_bench"} <= set(jobs)
    assert {"synth", "extract", "train", "bench", "report"} <= set(jobs)


# ---- drafter methods side by side ------------------------------------------------------------


def test_adding_a_method_adds_its_jobs_only(done_copy):
    """A second method trains and benchmarks on what the first one's run already has."""
    jobs = plan("--config", "train={methods: [eagle3, dflash]}", repo=done_copy)
    assert job_names(jobs) == ["bench[method=dflash]", "report", "train[method=dflash]"]


def test_adding_a_variant_adds_its_jobs_only(done_copy):
    """A variant of a method (given on the command line: its numbers arrive as strings) trains
    and benchmarks on the same data, beside the method it varies."""
    variant = "variants: {eagle3_ttt2: {method: eagle3, eagle3: {ttt_steps: 2}}}"
    jobs = plan("--config", f"train={{methods: [eagle3, eagle3_ttt2], {variant}}}", repo=done_copy)
    assert job_names(jobs) == [
        "bench[method=eagle3_ttt2]",
        "report",
        "train[method=eagle3_ttt2]",
    ]


# EAGLE-3, DFlash and a DFlash variant at another block size, from one dataset
METHODS_AND_VARIANT = {
    "train": {
        "methods": ["eagle3", "dflash", "dflash_b4"],
        "variants": {"dflash_b4": {"method": "dflash", "dflash": {"block_size": 4}}},
    }
}


@pytest.fixture(scope="module")
def both_methods_done(tmp_path_factory):
    """A finished (--touch) run of the default config with EAGLE-3, DFlash and a DFlash
    variant (METHODS_AND_VARIANT)."""
    import yaml

    work = tmp_path_factory.mktemp("methods")
    both = work / "both.yaml"
    both.write_text(yaml.safe_dump(METHODS_AND_VARIANT))
    mark_done(REPO, "--configfile", DEFAULT_CONFIG, str(both), workdir=work)
    return work, both


DFLASH = ["bench[method=dflash]", "train[method=dflash]"]
B4 = ["bench[method=dflash_b4]", "train[method=dflash_b4]"]
EAGLE3 = ["bench[method=eagle3]", "train[method=eagle3]"]
BENCHES = ["bench[method=dflash]", "bench[method=dflash_b4]", "bench[method=eagle3]"]


@pytest.mark.parametrize(
    "change, expected",
    [
        # a DFlash key re-runs DFlash's training and bench only; prepare, vocab, extract stay;
        # the variant keeps its own block size
        ({"train": {"dflash": {"block_size": 6}}}, [*DFLASH, "report"]),
        # a DFlash key the variant does not set: the variant too
        ({"train": {"dflash": {"epochs": 9}}}, [*DFLASH, *B4, "report"]),
        # the variant's own key: the variant only
        ({"train": {"variants": {"dflash_b4": {"dflash": {"max_anchors": 16}}}}}, [*B4, "report"]),
        # an EAGLE-3 key, EAGLE-3's only
        ({"train": {"eagle3": {"ttt_steps": 2}}}, [*EAGLE3, "report"]),
        # a shared key: every drafter
        ({"train": {"lr": 0.002}}, [*DFLASH, *B4, *EAGLE3, "report"]),
        # one drafter's k: its bench only
        (
            {"bench": {"num_speculative_tokens": {"eagle3": [3], "dflash": [5], "dflash_b4": [3]}}},
            ["bench[method=dflash]", "report"],
        ),
        # what the baseline measures: every drafter's bench (each measures it beside its own),
        # and the benchmark sets, whose prompts must leave room for the answer
        (
            {"bench": {"max_tokens": 64}},
            [*BENCHES, "prompts_bench[name=humaneval]", "prompts_bench[name=mtbench]", "report"],
        ),
        # DFlash on layers of its own: extraction captures them too, and everything after it
        (
            {"train": {"dflash": {"layer_ids": [1, 15]}}},
            ["extract[part=0]", "extract_gather", *DFLASH, *B4, *EAGLE3, "report"],
        ),
    ],
)
def test_a_change_replans_the_methods_it_concerns(both_methods_done, tmp_path, change, expected):
    import yaml

    work, both = both_methods_done
    assert plan("--configfile", DEFAULT_CONFIG, str(both), workdir=work) == []
    changed = tmp_path / "change.yaml"
    changed.write_text(yaml.safe_dump(change))
    jobs = plan("--configfile", DEFAULT_CONFIG, str(both), str(changed), workdir=work)
    assert job_names(jobs) == sorted(expected)


@pytest.fixture(scope="module")
def methods_repo_done(tmp_path_factory):
    """A copy of the repository with a finished (--touch) run of METHODS_AND_VARIANT."""
    import yaml

    repo = copy_repo(tmp_path_factory.mktemp("methods-repo"))
    both = repo / "both.yaml"
    both.write_text(yaml.safe_dump(METHODS_AND_VARIANT))
    mark_done(repo, "--configfile", str(both))
    return repo, both


@pytest.mark.parametrize(
    "module, expected",
    [
        # DFlash's own module: DFlash's jobs and its variant's (same method), no EAGLE-3 job
        ("dflash.py", [*DFLASH, *B4, "report"]),
        ("eagle3.py", [*EAGLE3, "report"]),
        # a method no drafter of this run uses: nothing
        ("peagle.py", []),
        # what every method shares: every drafter
        ("base.py", [*DFLASH, *B4, *EAGLE3, "report"]),
    ],
)
def test_a_code_edit_in_one_method_replans_its_drafters_only(methods_repo_done, module, expected):
    """An edit to one method's module re-runs the train and bench jobs of that method's
    drafters (and the report that shows them), no other method's: each job's code hash covers
    the method it trains or serves and the shared base (staleness.code.logic_modules)."""
    repo, both = methods_repo_done
    assert plan("--configfile", str(both), repo=repo) == []
    path = repo / "src" / "eagle3_pipeline" / "methods" / module
    with edited(path, real_change):
        jobs = plan("--configfile", str(both), repo=repo)
    assert job_names(jobs) == sorted(expected)
    assert all(j.reason.startswith("Params have changed") for j in jobs if j.rule == "train")


# ---- extract.mode online/hybrid: the train jobs extract for themselves ------------------------

ONLINE = "extract={mode: online}"


def test_online_mode_has_no_extract_job_and_its_train_job_holds_the_servers(tmp_path):
    """Online, the DAG has no extract or extract_gather job and nothing reads a manifest; the
    train job holds the trainer's GPUs and its extraction server's (TP 8 each here), or only
    the trainer's when extract.endpoints names servers elsewhere."""
    args = ("--configfile", DEFAULT_CONFIG, "--resources", "gpus=16", "--config", CUDA_TP8)
    jobs = plan(*args, ONLINE, workdir=tmp_path)
    rules = by_rule(jobs)
    assert not {"extract", "extract_gather"} & set(rules)
    assert rules["train"] == rules["bench"] == 1
    assert [j.gpus for j in jobs if j.rule == "train"] == [16]
    assert all("hidden_states" not in j.fields.get("input", "") for j in jobs)
    remote = "extract={mode: hybrid, endpoints: [http://inference-node:8000/v1], servers: 2}"
    jobs = plan(*args, remote, workdir=tmp_path)
    assert [j.gpus for j in jobs if j.rule == "train"] == [8]


def test_online_mode_on_one_gpu_colocates_its_servers_with_the_trainer(tmp_path):
    """One GPU: an online train job whose server takes a GPU of its own needs two and is
    refused before any job; with extract.colocate the server shares the trainer's one."""
    args = ("--configfile", str(REPO / "config" / "gpu-quality.yaml"), "--resources", "gpus=1")
    out = snakemake("-n", *args, "--config", ONLINE, workdir=tmp_path, check=False)
    assert out.returncode != 0
    assert "--resources gpus=1 is less than" in out.stdout + out.stderr
    jobs = plan(*args, "--config", "extract={mode: online, colocate: true}", workdir=tmp_path)
    assert {j.gpus for j in jobs if j.rule == "train"} == {1}
    assert "extract" not in by_rule(jobs)


def test_online_train_over_nodes_needs_endpoints(tmp_path):
    out = snakemake(
        "-n",
        "--configfile",
        DEFAULT_CONFIG,
        "--config",
        ONLINE,
        "train={nodes: 2}",
        workdir=tmp_path,
        check=False,
    )
    assert out.returncode != 0
    assert "`extract.mode`: online with train.nodes 2 needs extract.endpoints" in out.output


@pytest.fixture(scope="module")
def online_done(tmp_path_factory) -> Path:
    repo = copy_repo(tmp_path_factory.mktemp("repo-online"))
    mark_done(repo, "--config", ONLINE)
    return repo


@pytest.mark.parametrize(
    "change",
    [
        "extract={mode: online, layer_ids: [3, 15, 27]}",
        "extract={mode: online, storage: fp8}",
        "extract={mode: hybrid}",
    ],
)
def test_an_extraction_change_in_online_mode_replans_train_and_what_follows(online_done, change):
    """Online, extraction's result keys are the train job's: a change re-runs training (and
    bench, report), never synth, prepare or vocab."""
    jobs = rerun_plan(online_done, "--config", change)
    assert set(jobs) == {"train", "bench", "report", "all"}, jobs
    assert jobs["train"].startswith("Params have changed since last execution")


def test_operational_extraction_keys_in_online_mode_rerun_nothing(online_done):
    change = (
        "extract={mode: online, servers: 2, concurrency: 3, hybrid_disk_gib: 1, colocate: true, "
        "colocated_gpu_memory: 0.3, endpoints: [http://inference-node:8000/v1], "
        "min_next_token_agreement: 0.5}"
    )
    out = snakemake("-n", "--config", change, repo=online_done).output
    assert "Nothing to be done" in out, out


def test_an_extraction_code_edit_in_online_mode_replans_train_not_synth(online_done):
    """The train job runs extraction's request, checks and connector: its code hash covers
    them, so an edit re-plans training and what follows, and no extraction job exists."""
    closures = code_closures(online_done)
    assert {"extract.client", "extract.validator", "hidden_states.connector"} <= set(
        closures["train"]
    )
    with edited(online_done / "src" / "eagle3_pipeline" / "extract" / "client.py", real_change):
        jobs = rerun_plan(online_done, "--config", ONLINE)
    assert set(jobs) == {"train", "bench", "report", "all"}, jobs
    assert jobs["train"].startswith("Params have changed since last execution")
