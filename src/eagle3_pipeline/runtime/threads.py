"""OpenMP threads of the pipeline's CPU processes (vLLM servers, training).

By default an OpenMP thread that finishes its share of a parallel region keeps a core busy for a
while before it sleeps (libgomp spins, Intel's OpenMP waits KMP_BLOCKTIME, 200 ms), betting that
the next region follows at once and that the core is its own. Jobs that share cores lose that
bet: Snakemake runs jobs side by side (two synth parts, a train job beside an extraction), and
each one's spinning threads take the core from the others. Measured on 2 cores with two busy
processes beside it (benchmarks/cpu_openmp_wait.py, docs/dependencies.md "OpenMP on the CPU"):
training spent about twice the CPU seconds spinning and took longer; alone, sleeping threads
cost it little.

So the pipeline's CPU processes get ``OMP_WAIT_POLICY=PASSIVE`` (both libraries sleep at
once), unless the environment names a policy; an empty value leaves each library its own
default.
"""

from __future__ import annotations

WAIT_POLICY = "OMP_WAIT_POLICY"
SHARED_CORES_POLICY = "PASSIVE"


def cpu_wait_policy(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the OpenMP wait policy of a process that shares its cores: PASSIVE where
    the variable is unset, as given where set, removed where set empty."""
    out = dict(env)
    value = out.get(WAIT_POLICY)
    if value is None:
        out[WAIT_POLICY] = SHARED_CORES_POLICY
    elif not value.strip():
        del out[WAIT_POLICY]
    return out
