"""Run the snakemake CLI on this workflow in a subprocess and read its dry-run plan.

The Python API has no public "planned jobs" call, so tests parse the job blocks `snakemake -n`
prints (one per job: ``rule NAME:`` then indented ``key: value`` lines); those carry the
rule, wildcards, reason and evaluated resources of every job.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
if not Path(SNAKEMAKE).exists():  # an interpreter outside a venv: take the one on PATH
    SNAKEMAKE = shutil.which("snakemake") or SNAKEMAKE

STAGES = (
    "target",
    "prompts_train",
    "prompts_bench",
    "synth",
    "synth_gather",
    "prepare",
    "vocab",
    "extract",
    "extract_gather",
    "train",
    "bench_baseline",
    "bench",
    "report",
)
# Which stages consume each stage's outputs (from rules/*.smk), for "what reruns downstream".
CONSUMERS = {
    "target": {
        "synth",
        "synth_gather",
        "vocab",
        "extract",
        "train",
        "bench_baseline",
        "bench",
        "report",
    },
    "prompts_train": {"synth", "synth_gather", "bench_baseline", "bench", "report"},
    "prompts_bench": {"bench_baseline", "bench", "report"},
    "synth": {"synth_gather"},
    "synth_gather": {"prepare", "report"},
    "prepare": {"vocab", "extract", "train", "report"},
    "vocab": {"train", "report"},
    "extract": {"extract_gather"},
    "extract_gather": {"train", "bench", "report"},
    "train": {"bench", "report"},
    "bench_baseline": {"bench"},
    "bench": {"report"},
    "report": {"all"},
}


def downstream(stages: set[str]) -> set[str]:
    todo, seen = list(stages), set(stages)
    while todo:
        for nxt in CONSUMERS.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


@dataclass
class Job:
    rule: str
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def resources(self) -> dict[str, str]:
        text = self.fields.get("resources", "")
        return dict(item.split("=", 1) for item in text.split(", ") if "=" in item)

    @property
    def gpus(self) -> int:
        """The job's `gpus` resource; a rule without one asks for none."""
        return int(self.resources.get("gpus", 0))

    @property
    def wildcards(self) -> dict[str, str]:
        text = self.fields.get("wildcards", "")
        return dict(item.split("=", 1) for item in text.split(", ") if "=" in item)

    @property
    def reason(self) -> str:
        return self.fields.get("reason", "")


_RULE = re.compile(r"^(?:local)?(?:rule|checkpoint) (\S+):$")
_FIELD = re.compile(r"^    (\w+): (.*)$")


def parse_jobs(text: str) -> list[Job]:
    """The job blocks of a `snakemake -n` output, in printed order."""
    jobs: list[Job] = []
    for line in text.splitlines():
        m = _RULE.match(line)
        if m:
            jobs.append(Job(m.group(1)))
            continue
        m = _FIELD.match(line)
        if m and jobs:
            jobs[-1].fields.setdefault(m.group(1), m.group(2))
    return jobs


def job_names(jobs: list[Job]) -> list[str]:
    """Sorted ``rule[wildcard=value, ...]`` of the jobs, without the `all` target."""
    names = []
    for j in jobs:
        if j.rule == "all":
            continue
        wc = j.wildcards
        names.append(j.rule + (f"[{', '.join(f'{k}={v}' for k, v in wc.items())}]" if wc else ""))
    return sorted(names)


def env_for(src: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(src)
    env.pop("SLURM_JOB_ID", None)
    return env


def snakemake(
    *args: str,
    repo: Path = REPO,
    workdir: Path | None = None,
    check: bool = True,
    timeout: float = 120,
    slurm=None,
) -> subprocess.CompletedProcess:
    """Run `snakemake --snakefile <repo>/Snakefile [--directory workdir] args...`; with
    ``slurm`` (a tests/local_slurm.LocalSlurm) through the repo's Slurm profile on it.

    With a working directory other than the checkout, the Snakefile's relative
    `configfile: config/config.yaml` is not there: pass --configfile explicitly.
    """
    env = env_for(repo / "src")
    if slurm is not None:
        env = slurm.environ(env)
        args = (
            "--profile",
            str(repo / "profiles" / "slurm"),
            "--slurm-init-seconds-before-status-checks",
            "1",
            *args,
        )
    cmd = [SNAKEMAKE, "--snakefile", str(repo / "Snakefile")]
    if workdir is not None:
        cmd += ["--directory", str(workdir)]
    cmd += list(args)
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout)
    proc.output = proc.stdout + proc.stderr  # type: ignore[attr-defined]
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.output}")
    return proc


def plan(*args: str, **kw) -> list[Job]:
    """The jobs `snakemake -n args...` would run."""
    return parse_jobs(snakemake("-n", *args, **kw).output)


def copy_repo(dest: Path) -> Path:
    """A copy of what the workflow needs, so a test may edit library files and run in it."""
    for name in (
        "Snakefile",
        "rules",
        "workflow_scripts",
        "config",
        "src",
        "report",
        "profiles",
        "envs",
    ):
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / name)
    return dest


def mark_done(repo: Path, *args: str, workdir: Path | None = None) -> None:
    """Create every planned output empty and record real metadata for it (--touch)."""
    jobs = plan(*args, repo=repo, workdir=workdir)
    outputs = [o for j in jobs for o in j.fields.get("output", "").split(", ") if o]
    directories = {"prepare/dataset", "report/plots"}  # the directory() outputs in rules/
    for o in outputs:
        path = (workdir or repo) / o
        if any(o.endswith(d) for d in directories):
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
    snakemake("--touch", "--forceall", "--cores", "1", *args, repo=repo, workdir=workdir)


def rerun_plan(repo: Path, *args: str) -> dict[str, str]:
    """rule -> Snakemake's reason, of the jobs a dry run in ``repo`` plans."""
    return {j.rule: j.reason for j in plan(*args, repo=repo)}


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


def sbatch_flag(cmd: str, pattern: str) -> int | None:
    """The integer of ``pattern``'s group in an sbatch line, None where it does not occur."""
    m = re.search(pattern, cmd)
    return int(m.group(1)) if m else None
