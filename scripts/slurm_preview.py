#!/usr/bin/env python
"""Show the sbatch command every planned job would be submitted with, without Slurm.

    python scripts/slurm_preview.py --profile profiles/slurm --configfile config/kimi-k2.5.yaml \
        --config 'target={path: /tmp/kimi}' [--json]

Takes the same arguments as `snakemake`. Snakemake parses them (profile included) and builds the
DAG as for `snakemake --dag`; each job is then handed to snakemake-executor-plugin-slurm's own
code that builds the sbatch call (`submit_string.get_submit_command` + `utils.set_gres_string`,
as `Executor.run_job` does). Only the account check, which asks sacctmgr, is skipped, and the
`--wrap` payload (the job's own snakemake command) is left out.
"""

from __future__ import annotations

import json
import logging
import sys
from types import SimpleNamespace


def preview(argv: list[str]) -> list[dict]:
    import snakemake.cli as cli
    from snakemake.workflow import Workflow

    captured: dict = {}

    def capture_dag(self):  # stands in for Workflow.printdag (what --dag calls)
        self._prepare_dag(
            forceall=self.dag_settings.forceall, ignore_incomplete=True, lock_warn_only=True
        )
        self._build_dag()
        captured["workflow"] = self
        captured["jobs"] = [j for j in self.dag.jobs if not j.rule.norun]  # skip `all`

    Workflow.printdag = capture_dag
    try:
        cli.main([*argv, "--dag"])
    except SystemExit as e:
        if e.code not in (0, None) or "jobs" not in captured:
            raise SystemExit(f"snakemake failed (exit {e.code}); see its message above") from e
    return [submit_call(job, captured["workflow"]) for job in captured["jobs"]]


def submit_call(job, workflow) -> dict:
    import snakemake_executor_plugin_slurm as plugin
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    # Executor.get_account_arg validates the account with sacctmgr; there is no Slurm here.
    plugin.validate_account = lambda account, logger: account
    executor = SimpleNamespace(
        _fallback_account_arg=None,
        _fallback_partition=None,
        _partitions=None,
        logger=logging.getLogger("slurm-preview"),
    )
    params = {
        "run_uuid": "<run-uuid>",
        "slurm_logfile": f".snakemake/slurm_logs/rule_{job.name}/%j.log",
        "comment_str": f"rule_{job.name}",
        "account": next(plugin.Executor.get_account_arg(executor, job)),
        "partition": plugin.Executor.get_partition_arg(executor, job),
        "workdir": workflow.workdir_init,
    }
    call = get_submit_command(job, params, settings=workflow.executor_settings)
    call += set_gres_string(job)
    return {"rule": job.name, "wildcards": dict(job.wildcards_dict), "sbatch": call}


def main() -> None:
    argv = sys.argv[1:]
    as_json = "--json" in argv
    argv = [a for a in argv if a != "--json"]
    calls = preview(argv)
    if as_json:
        print(json.dumps(calls, indent=1))
    else:
        for c in calls:
            wc = ",".join(f"{k}={v}" for k, v in c["wildcards"].items())
            print(f"# {c['rule']}{' [' + wc + ']' if wc else ''}\n{c['sbatch']}\n")


if __name__ == "__main__":
    main()
