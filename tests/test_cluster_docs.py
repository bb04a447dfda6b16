"""The command lines docs/cluster.md gives for GPU nodes and Slurm, run as written (read from the
page itself) as dry runs: each must plan, and the Slurm ones must submit what the page says.

A command's model path that does not exist here is replaced by a stand-in directory
(``stand_in_model``): the published config.json of Llama-3.1-8B or Kimi-K2.5 from
tests/data/models with the packaged tokenizer, no weights. Nothing is submitted and no model is
loaded.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import humanfriendly
import pytest

from smkcli import REPO, env_for, parse_jobs, snakemake

# the page's commands run as dry runs, each a snakemake subprocess of ~3 s of CPU
pytestmark = pytest.mark.slow

DOC = REPO / "docs" / "cluster.md"
TARGET = re.compile(r"^target=\{path: (.*)\}$")


def doc_commands(program: str) -> list[str]:
    """The lines of the page's code blocks (indented 4+ spaces) that run `program`, with their
    backslash continuations joined."""
    commands, current = [], None
    for line in DOC.read_text().splitlines():
        text = line.strip()
        if current is None and not (line.startswith("    ") and text.startswith(program + " ")):
            continue
        current = f"{current} {text}" if current is not None else text
        if current.endswith("\\"):
            current = current[:-1].rstrip()
        else:
            commands.append(current)
            current = None
    return commands


SNAKEMAKE_COMMANDS = doc_commands("snakemake")
PREVIEW_COMMANDS = doc_commands("python")


def test_the_page_has_the_commands_of_each_setting():
    joined = "\n".join(SNAKEMAKE_COMMANDS)
    assert len(SNAKEMAKE_COMMANDS) >= 8, SNAKEMAKE_COMMANDS
    one_node = "snakemake --cores all --resources gpus=8 --configfile config/llama-8b.yaml"
    assert one_node in joined
    assert "snakemake --profile profiles/slurm --configfile config/llama-8b.yaml" in joined
    assert "--configfile config/kimi-k2.5.yaml" in joined
    assert [c for c in PREVIEW_COMMANDS if "scripts/slurm_preview.py" in c]


@pytest.fixture(scope="module")
def stand_ins(stand_in_model) -> dict[str, Path]:
    """Stand-ins for the weights of the profiles' targets (the plan reads their config.json)."""
    return {"llama": stand_in_model("llama-3.1-8b"), "kimi": stand_in_model("kimi-k2.5")}


def as_test_args(command: str, stand_ins: dict[str, Path]) -> list[str]:
    """The command's arguments, with the model path replaced by a stand-in and the repository's
    relative paths made absolute (the test runs in its own working directory)."""
    args = shlex.split(command.replace("$PWD", str(REPO)))[1:]
    if args[0] == "scripts/slurm_preview.py":
        args = args[1:]
    config = args[args.index("--configfile") + 1] if "--configfile" in args else ""
    stand_in = stand_ins["llama"] if "llama" in config else stand_ins["kimi"]
    out, targets = [], 0
    for arg in args:
        m = TARGET.match(arg)
        if m:
            targets += 1
            if not (Path(m.group(1)) / "config.json").is_file():
                arg = f"target={{path: {stand_in}}}"
        elif arg.startswith(("config/", "profiles/")):
            arg = str(REPO / arg)
        out.append(arg)
    assert targets == 1, f"the command names no model (target={{path: ...}}): {command}"
    return out


@pytest.mark.parametrize("command", SNAKEMAKE_COMMANDS)
def test_a_documented_command_plans(command, stand_ins, tmp_path):
    args = as_test_args(command, stand_ins)
    if "-n" not in args:
        args.insert(0, "-n")
    output = snakemake(*args, workdir=tmp_path).output
    jobs = parse_jobs(output)
    assert {j.rule for j in jobs} >= {"synth", "extract", "train", "bench", "report"}, command
    # the plan read the stand-in's config.json (docs/plan.md)
    assert "layers            aux [" in output and "WARNING [target]" not in output, output


def preview(args: list[str], workdir: Path) -> list[dict]:
    cmd = [sys.executable, str(REPO / "scripts" / "slurm_preview.py"), "--json"]
    cmd += ["--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir), *args]
    proc = subprocess.run(
        cmd, cwd=workdir, env=env_for(REPO / "src"), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout[proc.stdout.index("[") :])


def test_the_preview_prints_the_lines_the_page_shows(stand_ins, tmp_path):
    (command,) = [c for c in PREVIEW_COMMANDS if "scripts/slurm_preview.py" in c]
    calls = preview(as_test_args(command, stand_ins), tmp_path)
    shown = [line.strip()[4:] for line in DOC.read_text().splitlines() if "... --comment" in line]
    assert len(shown) == 5, shown
    for line in shown:
        rule = re.search(r"--comment rule_(\w+)", line).group(1)
        sbatch = {" ".join(c["sbatch"].split()) for c in calls if c["rule"] == rule}
        assert len(sbatch) == 1, (rule, sbatch)
        assert sbatch.pop().replace(str(tmp_path), "<checkout>").endswith(line), rule


@pytest.mark.parametrize("command", [c for c in SNAKEMAKE_COMMANDS if "profiles/slurm" in c])
def test_a_documented_slurm_run_submits_one_node_jobs_with_its_wall_times(
    command, stand_ins, tmp_path
):
    """Every job on one node but a train job of train.nodes > 1, which is one allocation of
    that many nodes, a task each."""
    args = as_test_args(command, stand_ins)
    calls = preview(args, tmp_path)
    wall_times = {}  # from --set-resources RULE:runtime=VALUE
    if "--set-resources" in args:
        for item in args[args.index("--set-resources") + 1 :]:
            if item.startswith("-"):
                break
            rule, value = item.split(":runtime=")
            wall_times[rule] = humanfriendly.parse_timespan(value) // 60
    nodes = re.search(r"train=\{[^}]*nodes: (\d+)", " ".join(args))
    for c in calls:
        if c["rule"] == "train" and nodes and int(nodes.group(1)) > 1:
            n = int(nodes.group(1))
            assert f"--nodes={n}" in c["sbatch"] and f"--ntasks={n}" in c["sbatch"], c
            assert "--ntasks-per-gpu" not in c["sbatch"], c
        else:
            assert "--nodes=1" in c["sbatch"], c
        if c["rule"] in wall_times:
            assert f" -t {wall_times[c['rule']]:.0f} " in c["sbatch"], c
    gpus = {c["rule"]: re.search(r"--gpus=(\d+)", c["sbatch"]) for c in calls}
    if "llama-8b" in command:  # one GPU per vLLM server, four for training (config/llama-8b.yaml)
        assert {r: int(m.group(1)) for r, m in gpus.items() if m} == {
            "synth": 1,
            "extract": 1,
            "train": 4,
            "bench": 1,
        }
