"""OpenMP threads of the pipeline's CPU training.

By default an OpenMP thread that finishes its share of a parallel region keeps its core busy a
while before it sleeps (libgomp spins), betting that the next region follows at once and that
the core is its own. A train job that shares its cores loses that bet: Snakemake runs jobs side
by side, and the spinning threads take the cores from the others and from training itself.
Beside two busy processes on 2 cores, the CI run's training took 0.62-0.65x the wall time and
0.54-0.56x the CPU seconds with threads that sleep at once; alone, the same wall time
(benchmarks/cpu_openmp_wait.py; docs/dependencies.md, "Threads of CPU training"). A vLLM
server on the CPU decodes in many short parallel regions: there, sleeping threads made the
answers 1.25-1.38x slower alone, so servers keep the library's default.

So CPU training gets ``OMP_WAIT_POLICY=PASSIVE`` unless the environment names a policy; an empty
value leaves the library its own default.
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
