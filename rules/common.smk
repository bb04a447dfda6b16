# Shared helpers: config validation, paths, GPU counts, what makes a stage stale.
import os
import sys
import tempfile
from pathlib import Path

from snakemake.settings.types import DeploymentMethod

# Planning and every job import the library from this checkout's src/: the code that code()
# hashes is then exactly the code the jobs run (an installed copy of the package, e.g. an
# editable install of another checkout, would silently win otherwise).
# Jobs inherit PYTHONPATH; under --sdm conda Snakemake strips it unless
# --conda-not-block-search-path-envvars is given (the profiles set it).
SRC = str(Path(workflow.basedir) / "src")
sys.path.insert(0, SRC)
# (Environment variables are only set here, never required: `os.environ.update` rather than
# `os.environ[...] =`, which `snakemake --lint` mistakes for a read that needs `envvars:`.)
os.environ.update(
    PYTHONPATH=os.pathsep.join(
        [SRC] + [p for p in os.getenv("PYTHONPATH", "").split(os.pathsep) if p and p != SRC]
    )
)
if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method and not (
    workflow.deployment_settings.conda_not_block_search_path_envvars
):
    raise WorkflowError(
        "--sdm conda needs --conda-not-block-search-path-envvars: the jobs import the pipeline "
        f"library from {SRC} through PYTHONPATH, which Snakemake strips from conda jobs "
        "otherwise (profiles/default and profiles/slurm set it)."
    )

# Inside a Slurm job the allocation already owns its GPUs, and with ConstrainDevices every job
# sees them renumbered from 0: per-node lock files named after those ids would make two jobs
# on one node wait for each other. Locks are then kept per Slurm job (eagle3_pipeline.runtime.gpus).
if os.getenv("SLURM_JOB_ID"):
    os.environ.update(
        EAGLE3_GPU_LOCK_DIR=os.path.join(
            tempfile.gettempdir(), f"eagle3-pipeline-gpu-locks-slurm-{os.getenv('SLURM_JOB_ID')}"
        )
    )

from eagle3_pipeline import config as cfglib
from eagle3_pipeline import plan as planlib
from eagle3_pipeline.target.stage import defining_files
from eagle3_pipeline.staleness.code import code_hash, logic_modules
from eagle3_pipeline.plan import kept
from eagle3_pipeline.staleness.interrupted import interrupted_targets

try:
    cfglib.validate(config)
except cfglib.ConfigError as err:
    raise WorkflowError(str(err)) from None

RUN = cfglib.run_dir(config)

# Outputs that a failed or cancelled job removed while results made from them stay: Snakemake
# alone would call those results current and rebuild nothing; the default target asks for
# them again (staleness/interrupted.py).
INTERRUPTED = interrupted_targets() if workflow.is_main_process else []

# The plan (docs/plan.md): printed whenever the workflow is planned in the main process, dry
# runs included; its problems stop a real run in onstart, before the first job.
PLAN = planlib.make_plan(config, RUN) if workflow.is_main_process else None
if PLAN is not None:
    print(planlib.format_plan(PLAN), file=sys.stderr)
    # what a valid config does that may not be meant (config.notes); nothing stops
    for note in cfglib.notes(config):
        print(f"NOTE: {note}", file=sys.stderr)


wildcard_constraints:
    part=r"\d+",
    name=r"[A-Za-z0-9_-]+",
    method="|".join(cfglib.drafter_names(config)),


def out(path):
    """A path inside this run's results directory."""
    return f"{RUN}/{path}"


def log_of(rule_name):
    return f"{RUN}/logs/{rule_name}.log"


def bench_of(rule_name):
    return f"{RUN}/benchmarks/{rule_name}.tsv"


def code(script, drafters=()):
    """Param: hash of the code that decides what a stage computes (its script and logic
    modules, without comments and docstrings): a real edit re-runs the stage. Of the drafter
    methods' own modules it covers those of ``drafters`` (the drafters the job trains or
    serves), so an edit to one method re-runs no other method's jobs. The text names what it
    covers, so that a dry run's "Params have changed" says it was the code."""
    path = Path(workflow.basedir) / script
    own = tuple(sorted({cfglib.method_of(config, d) for d in drafters}))
    return f"code {code_hash(path, own)} of {path.name} + {', '.join(logic_modules(path, own))}"


def result(rule_name, **kw):
    """Param: the config keys that change this rule's output (config.RESULT_KEYS). Other keys
    reach the job through snakemake.config and re-run nothing."""
    return cfglib.result_config(config, rule_name, **kw)


def target_files():
    """A local target's small files that define it (config, tokenizer, chat template)."""
    return defining_files(config["target"])


def train_prompt_files():
    return cfglib.prompt_files(config["prompts"]["train"])


def bench_prompt_files(wildcards):
    return cfglib.prompt_files([cfglib.bench_set_spec(config, wildcards.name)])


def gpus(stage):
    return cfglib.stage_gpus(config, stage)


def vllm_threads():
    """A job's vLLM server on the CPU uses every core: it says so, and Snakemake runs it alone
    (a benchmark measured beside another server measures the contention; the shared baseline,
    ready right after the prompts, would otherwise run beside synth). On GPUs the `gpus`
    resource orders the servers."""
    # 64: more than any CPU node here has; Snakemake caps a job's threads at --cores (asking
    # for workflow.cores would fail where no --cores is given, as under the slurm executor)
    return 64 if config["vllm"]["device"] == "cpu" else 1


def measurement_threads():
    """A speed measurement holds every core whatever the device, so that Snakemake runs no
    other job beside it (a training or another server would be measured with it). Without
    --cores (a cluster executor: every job has an allocation of its own) 64."""
    return workflow.resource_settings.cores or 64


def separate_baseline():
    """bench's input from bench_baseline: the shared baseline, with bench.pairing: separate
    only (alternate measures it beside each drafter)."""
    if config["bench"]["pairing"] == "separate":
        return out("bench/baseline.json")
    return []


def synth_parts():
    return list(range(config["synth"]["jobs"]))


def train_nodes_resources():
    """A train job over several nodes (train.nodes > 1) is one Slurm allocation of that many
    nodes, one task each; its script runs once, on the first node, and starts torchrun on
    every node itself (srun inside the allocation: the plugin's `mpi` launch, which runs the
    job's script without wrapping it in a one-node step). One node needs nothing."""
    nodes = config["train"]["nodes"]
    if nodes == 1:
        return {}
    # tasks_per_gpu 0: the plugin would otherwise turn `tasks` into --ntasks-per-gpu for a job
    # with GPUs
    return {"nodes": nodes, "tasks": nodes, "tasks_per_gpu": 0, "mpi": "srun"}


def extract_parts():
    return list(range(config["extract"]["jobs"]))


def stored_hidden_states():
    """The extraction's manifest as an input (train, bench, report), with extract.mode stored;
    online or hybrid the train jobs extract themselves and there is none (nor any extract
    job)."""
    if cfglib.extracts_in_train(config):
        return {}
    return {"manifest": out("hidden_states/manifest.json")}


def drafter_methods():
    """The drafters (methods and variants) trained and benchmarked side by side
    (train.methods)."""
    return config["train"]["methods"]


def bench_sets():
    """The benchmark prompt sets the bench stage measures (the held-out set included)."""
    return cfglib.bench_sets(config)


# prompts_bench makes every benchmark set but the held-out one, which prompts_train writes
# (a wildcard pattern for prompts/bench_{name}.<ext>: the name is not followed by its ".")
NOT_HELDOUT = rf"(?!{cfglib.HELDOUT_SET}\.)[A-Za-z0-9_-]+"


def heldout_outputs():
    """prompts_train's outputs for the held-out benchmark set, when prompts.heldout > 0."""
    if not config["prompts"]["heldout"]:
        return {}
    name = cfglib.HELDOUT_SET
    return {
        "heldout": out(f"prompts/bench_{name}.jsonl"),
        "heldout_stats": out(f"prompts/bench_{name}.stats.json"),
    }


def final_targets():
    return [out("report/report.html")]


def global_gpus():
    """The N of `--resources gpus=N`, or None when it was not given."""
    res = workflow.global_resources.get("gpus")  # a snakemake Resource (value None if unset)
    return getattr(res, "value", res)


GPU_STAGES = ("synth", "extract", "train", "bench")

# Snakemake silently scales a job down to --resources gpus=N when it asks for more; the job
# would then fail at start (gpus.require_gpus). Say so before any job, in the main process
# only (a cluster job's own snakemake gets --resources gpus=<that job's count>).
if workflow.is_main_process and global_gpus() is not None:
    _short = {s: gpus(s) for s in GPU_STAGES if gpus(s) > global_gpus()}
    if _short:
        raise WorkflowError(
            f"--resources gpus={global_gpus()} is less than "
            + ", ".join(f"rule {s} needs {n}" for s, n in _short.items())
            + ". Snakemake would silently scale those jobs down; pass at least "
            f"--resources gpus={max(_short.values())} or lower vllm.tensor_parallel_size / "
            "train.gpus."
        )


onstart:
    # A real run only (a dry run does not start): the plan's problems stop it before any job,
    # unless plan.allow lists them; its plan is kept beside the results.
    if PLAN is not None and not workflow.touch:
        _refused = planlib.refusals(PLAN, config)
        if _refused:
            raise WorkflowError(
                "The plan refuses this run (nothing has started):\n  - "
                + "\n  - ".join(_refused)
            )
        planlib.write(PLAN, out("plan.json"))
    # A train job over several nodes needs an allocation of them: refuse before the first job
    # rather than after hours of synthesis and extraction.
    if (
        workflow.local_exec
        and config["train"]["nodes"] > 1
        and int(os.getenv("SLURM_JOB_NUM_NODES") or 0) < config["train"]["nodes"]
    ):
        raise WorkflowError(
            f"train.nodes is {config['train']['nodes']}: the train job spans that many nodes, "
            "which a local run does not have. Run with --profile profiles/slurm (the train "
            "job is then one allocation of train.nodes nodes), inside an allocation of that "
            "many nodes, or set train.nodes: 1."
        )
    # Local runs only: on a cluster each job gets its own GPUs from the scheduler.
    if workflow.local_exec and global_gpus() is None and any(gpus(s) for s in GPU_STAGES):
        print(
            "NOTE: no --resources gpus=N given, so Snakemake will not limit GPU jobs. "
            "Jobs still never share a device (each takes a file lock per GPU and waits for "
            "free ones), but pass e.g. `--resources gpus=8` to let Snakemake schedule them.",
            file=sys.stderr,
        )


onerror:
    # What the failed jobs' stages kept (plan/kept.py): the same command resumes from it.
    if workflow.is_main_process and (_kept := kept.message(Path(RUN), config)):
        print(_kept, file=sys.stderr)
