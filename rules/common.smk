# Shared helpers: config validation, paths, GPU counts, code inputs.
import sys
from pathlib import Path

# The library is installed into the project environment (scripts/setup.sh); the path entry
# keeps a plain checkout plannable too.
sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from eagle3_pipeline import config as cfglib
from eagle3_pipeline.workflow import module_closure

try:
    cfglib.validate(config)
except cfglib.ConfigError as err:
    raise WorkflowError(str(err)) from None

RUN = cfglib.run_dir(config)


wildcard_constraints:
    part=r"\d+",
    name=r"[A-Za-z0-9_-]+",


def out(path):
    """A path inside this run's results directory."""
    return f"{RUN}/{path}"


def log_of(rule_name):
    return f"{RUN}/logs/{rule_name}.log"


def bench_of(rule_name):
    return f"{RUN}/benchmarks/{rule_name}.tsv"


def code_of(script):
    """The library modules a workflow script imports: an edit to one re-runs the stage."""
    return list(module_closure(Path(workflow.basedir) / script))


def gpus(stage):
    return cfglib.stage_gpus(config, stage)


def extract_parts():
    return list(range(config["extract"]["jobs"]))


def bench_names():
    return cfglib.bench_names(config)


def final_targets():
    return [out("report/report.html")]


onstart:
    if not workflow.global_resources.get("gpus") and any(
        gpus(s) for s in ("synth", "extract", "train", "bench")
    ):
        print(
            "NOTE: no --resources gpus=N given, so Snakemake will not limit GPU jobs. "
            "Jobs still never share a device (each takes a file lock per GPU and waits for "
            "free ones), but pass e.g. `--resources gpus=8` to let Snakemake schedule them.",
            file=sys.stderr,
        )
