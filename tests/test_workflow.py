"""Workflow-level behaviour, through the snakemake CLI: plans, GPU resources, reruns, profiles.

Every test is a dry run (or a `--touch` run) in a temporary directory: no stage code runs, so
these stay fast and need neither models nor vLLM. What they prove and what they do not is said
test by test.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from smkcli import REPO, STAGES, copy_repo, downstream, env_for, plan, snakemake

DEFAULT_CONFIG = str(REPO / "config" / "config.yaml")
CUDA_TP8 = "vllm={device: cuda, tensor_parallel_size: 8}"


def by_rule(jobs):
    return collections.Counter(j.rule for j in jobs)


@pytest.fixture(scope="module")
def fake_model_dir(tmp_path_factory) -> Path:
    """Stands in for a local model: the config check only wants a directory with config.json."""
    d = tmp_path_factory.mktemp("fake-model")
    (d / "config.json").write_text("{}")
    return d


# ---- the default plan ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def default_plan(tmp_path_factory):
    return plan("--configfile", DEFAULT_CONFIG, workdir=tmp_path_factory.mktemp("default"))


def test_default_config_plans_every_stage_once(default_plan):
    assert by_rule(default_plan) == {s: 1 for s in (*STAGES, "all")}
    for job in default_plan:
        if job.rule != "all":
            assert job.reason.startswith("Missing output files"), (job.rule, job.reason)


def test_default_config_asks_no_gpus(default_plan):
    # The embedded default runs on the CPU: no job may ask Snakemake (or Slurm) for a GPU.
    for job in default_plan:
        assert job.gpus == 0, (job.rule, job.resources)
        assert int(job.resources.get("gpu", 0)) == 0, (job.rule, job.resources)
    gpu_rules = {j.rule for j in default_plan if "gpus" in j.resources}
    assert gpu_rules == {"synth", "extract", "train", "bench"}


def test_lint_is_clean():
    out = snakemake("--lint").output
    assert "Congratulations, your workflow is in a good condition!" in out, out


# ---- GPU scheduling ------------------------------------------------------------------------


def test_cuda_config_asks_tensor_parallel_gpus(tmp_path):
    jobs = plan(
        "--configfile",
        DEFAULT_CONFIG,
        "--resources",
        "gpus=8",
        "--config",
        CUDA_TP8,
        workdir=tmp_path,
    )
    gpus = {j.rule: j.gpus for j in jobs}
    assert gpus == {
        "target": 0,
        "prompts": 0,
        "synth": 8,
        "prepare": 0,
        "vocab": 0,
        "extract": 8,
        "extract_gather": 0,
        "train": 0,
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
    assert by_rule(jobs) == {s: 1 for s in (*STAGES, "all")}
    gpus = {j.rule: j.gpus for j in jobs}
    assert gpus["extract"] == gpus["synth"] == gpus["bench"] == gpus["train"] == 8
    assert all(
        gpus[s] == 0 for s in ("target", "prompts", "prepare", "vocab", "extract_gather", "report")
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


# ---- Slurm -----------------------------------------------------------------------------------


def slurm_calls(*args: str, workdir: Path) -> list[dict]:
    """sbatch calls built by snakemake-executor-plugin-slurm's own code
    (scripts/slurm_preview.py)."""
    cmd = [
        sys.executable,
        str(REPO / "scripts" / "slurm_preview.py"),
        "--json",
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "--profile",
        str(REPO / "profiles" / "slurm"),
        *args,
    ]
    proc = subprocess.run(
        cmd, cwd=workdir, env=env_for(REPO / "src"), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout[proc.stdout.index("[") :])


def test_slurm_profile_asks_gpus_per_rule(tmp_path, fake_model_dir):
    calls = slurm_calls(
        "--configfile",
        str(REPO / "config" / "kimi-k2.5.yaml"),
        "--config",
        f"target={{path: {fake_model_dir}}}",
        "extract={jobs: 2}",
        workdir=tmp_path,
    )
    sbatch = collections.defaultdict(list)
    for c in calls:
        sbatch[c["rule"]].append(c["sbatch"])
    assert set(sbatch) == set(STAGES)
    assert len(sbatch["extract"]) == 2
    for rule, cmds in sbatch.items():
        for cmd in cmds:
            assert cmd.startswith("sbatch --parsable")
            assert " -A my_account " in cmd and " -p gpu " in cmd, cmd
            assert f"--comment rule_{rule}" in cmd
            if rule in ("synth", "extract", "train", "bench"):
                assert cmd.endswith(" --gpus=8"), cmd
                assert "--cpus-per-gpu=12" in cmd and "--mem-per-cpu 8000" in cmd, cmd
                assert "--ntasks" not in cmd
            else:
                assert "--gpus" not in cmd and "--cpus-per-task=" in cmd, cmd
    assert " -t 2880 " in sbatch["synth"][0]  # runtime "48h" from set-resources
    assert " -t 30 " in sbatch["prompts"][0]


def test_slurm_profile_on_the_cpu_default_asks_no_gpus(tmp_path):
    calls = slurm_calls("--configfile", DEFAULT_CONFIG, workdir=tmp_path)
    assert {c["rule"] for c in calls} == set(STAGES)
    assert not any("--gpus" in c["sbatch"] for c in calls)


# ---- reruns after a completed run ------------------------------------------------------------
# A real run takes ~20 minutes. Instead every output is created empty and `--touch --forceall`
# runs every job through Snakemake's touch executor, which records the same metadata a real
# job records (params, code, input checksums): `snakemake -n` afterwards says "Nothing to be
# done", so the rerun triggers below are evaluated against real metadata. What this does not
# prove: that the stage code itself reruns correctly (the end-to-end tests do that).


@pytest.fixture(scope="module")
def done_copy(tmp_path_factory) -> Path:
    repo = copy_repo(tmp_path_factory.mktemp("repo"))
    lib = repo / "src" / "eagle3_pipeline"
    for stage in STAGES:  # stage modules another branch has not delivered yet
        mod = lib / f"{stage}.py"
        if stage != "extract_gather" and not mod.exists():
            mod.write_text(f'"""Placeholder for eagle3_pipeline.{stage} (test copy)."""\n')
    jobs = plan(repo=repo)
    outputs = [o for j in jobs for o in j.fields.get("output", "").split(", ") if o]
    directories = {"prepare/dataset", "report/plots"}  # the directory() outputs in rules/
    for o in outputs:
        path = repo / o
        if any(o.endswith(d) for d in directories):
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
    snakemake("--touch", "--forceall", "--cores", "1", repo=repo)
    return repo


def rerun_plan(repo: Path, *args: str) -> dict[str, str]:
    return {j.rule: j.reason for j in plan(*args, repo=repo)}


def test_nothing_to_do_after_a_complete_run(done_copy):
    out = snakemake("-n", repo=done_copy).output
    assert "Nothing to be done" in out, out
    assert "missing provenance" not in out.lower()


def test_params_change_replans_that_stage_and_downstream(done_copy):
    jobs = rerun_plan(done_copy, "--config", "train={epochs: 7}")
    assert set(jobs) == {"train", "bench", "report", "all"}
    assert jobs["train"].startswith("Params have changed since last execution")
    assert "'epochs': 7" in jobs["train"]


def test_same_params_given_on_the_command_line_do_not_rerun(done_copy):
    # --config puts the key first in the section, config.yaml has it further down. The workflow
    # sorts config keys, so the section's repr (what Snakemake compares) does not change.
    import yaml

    epochs = yaml.safe_load(Path(DEFAULT_CONFIG).read_text())["train"]["epochs"]
    out = snakemake("-n", "--config", f"train={{epochs: {epochs}}}", repo=done_copy).output
    assert "Nothing to be done" in out, out


def edited(path: Path):
    """Context manager: append a comment to `path`, restore content and mtime afterwards."""
    import contextlib

    @contextlib.contextmanager
    def cm():
        text, st = path.read_text(), path.stat()
        path.write_text(text + "\n# edited by a test\n")
        try:
            yield
        finally:
            path.write_text(text)
            os.utime(path, (st.st_atime, st.st_mtime))

    return cm()


def code_inputs(repo: Path) -> dict[str, list[str]]:
    """Per stage, the library files its rule declares as code inputs (module_closure)."""
    prog = (
        "import json, sys; from pathlib import Path; "
        "from eagle3_pipeline.workflow import module_closure; "
        "print(json.dumps({s: [Path(m).name for m in module_closure(Path(sys.argv[1]) / "
        "'workflow_scripts' / (s + '.py'))] for s in sys.argv[2:]}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", prog, str(repo), *STAGES],
        env=env_for(repo / "src"),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)


def test_library_edit_replans_importing_stages_and_downstream(done_copy):
    module = done_copy / "src" / "eagle3_pipeline" / "vocab.py"
    importers = {s for s, files in code_inputs(done_copy).items() if "vocab.py" in files}
    assert "vocab" in importers
    with edited(module):
        jobs = rerun_plan(done_copy)
    assert set(jobs) == downstream(importers) | {"all"}
    assert {"vocab", "train", "bench", "report", "all"} <= set(jobs)
    assert not {"target", "prompts", "synth"} & set(jobs)  # upstream stays done
    assert jobs["vocab"] == f"Updated input files: {module}"
    for rule in set(jobs) - importers - {"all"}:
        assert jobs[rule].startswith("Input files updated by another job"), (rule, jobs[rule])
    assert "Nothing to be done" in snakemake("-n", repo=done_copy).output  # restored


def test_script_edit_replans_that_stage_and_downstream(done_copy):
    with edited(done_copy / "workflow_scripts" / "vocab.py"):
        jobs = rerun_plan(done_copy)
    assert set(jobs) == {"vocab", "train", "bench", "report", "all"}
    assert jobs["vocab"].startswith("Code has changed since last execution")
