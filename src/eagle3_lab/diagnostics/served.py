"""What vLLM proposes: the drafter served in-process by vLLM's offline engine on the CPU,
its proposals recorded step by step (:func:`served_proposals`; lab/drafter_proposals_cpu.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle3_pipeline import methods

from .walk import ReplayError

# ---- what vLLM proposes: the drafter served in-process, its proposals recorded -----------------


def _install_recorder(worker) -> str:
    """On vLLM's worker: wrap the drafter's ``propose`` to record, per call, the anchor tokens
    (``next_token_ids``) and the proposed ids."""
    drafter = worker.model_runner.drafter
    drafter._replay_calls = []
    original = drafter.propose

    def propose(*args, **kwargs):
        drafts = original(*args, **kwargs)
        anchors = kwargs.get("next_token_ids")
        drafter._replay_calls.append(
            {
                "anchors": None if anchors is None else anchors.tolist(),
                "drafts": drafts.tolist(),
            }
        )
        return drafts

    drafter.propose = propose
    return type(drafter).__name__


def _take_recorded(worker) -> list[dict[str, Any]]:
    drafter = worker.model_runner.drafter
    calls, drafter._replay_calls = drafter._replay_calls, []
    return calls


def _spec_counters(llm) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode_num"):
            out[metric.name] = getattr(metric, "values", None) or getattr(metric, "value", 0)
    return out


def _serve_main(job: dict[str, Any]) -> None:
    """In a process of its own: the target with the drafter on vLLM's offline engine (one
    request at a time, T=0), every proposal recorded (:func:`served_proposals`)."""
    from vllm import LLM, SamplingParams

    from eagle3_pipeline.runtime.files import write_json

    llm = LLM(
        model=job["target"],
        dtype=job.get("dtype", "float32"),
        enforce_eager=True,
        max_model_len=job.get("max_model_len", 2048),
        max_num_seqs=1,
        seed=0,
        disable_log_stats=False,
        speculative_config={
            "model": job["drafter"],
            **methods.get(job["method"]).speculative_config(),
            "num_speculative_tokens": job["k"],
        },
    )
    proposer = llm.collective_rpc(_install_recorder)[0]
    params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"])
    requests = []
    for messages in job["prompts"]:
        before = _spec_counters(llm)
        [out] = llm.chat(messages, params, use_tqdm=False)
        after = _spec_counters(llm)
        calls = llm.collective_rpc(_take_recorded)[0]
        requests.append(
            {
                "prompt_token_ids": list(out.prompt_token_ids),
                "outputs": list(out.outputs[0].token_ids),
                "finish_reason": out.outputs[0].finish_reason,
                # one request at a time: each call drafted for it alone
                "proposals": [(c["anchors"][0], c["drafts"][0]) for c in calls if c["drafts"]],
                "counters": {
                    name: (
                        [a - b for a, b in zip(after[name], before.get(name) or [], strict=False)]
                        if isinstance(after[name], list)
                        else after[name] - before.get(name, 0)
                    )
                    for name in after
                },
            }
        )
    write_json(job["out"], {"proposer": proposer, "job": job, "requests": requests})


def served_proposals(
    target: str | Path,
    drafter: str | Path,
    method: str,
    k: int,
    prompts: list[list[dict]],
    max_tokens: int,
    out: str | Path,
    log_path: str | Path | None = None,
    cache_root: str | Path | None = None,
    timeout_s: float = 900,
) -> dict[str, Any]:
    """What vLLM's drafter proposes at each decoding step, on the CPU: vLLM's offline engine in
    a process of its own (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so that the drafter's
    ``propose`` can be wrapped on the model runner), the target with the drafter at ``k``, each
    of ``prompts`` (chat messages) decoded alone at T=0 for up to ``max_tokens``. Per request:
    the prompt and output ids, per proposal (anchor token, drafts), and the deltas of the
    spec-decode counters. Written to ``out`` and returned."""
    import json
    import os
    import subprocess
    import sys

    from eagle3_pipeline.runtime.files import read_json
    from eagle3_pipeline.server import vllm_environment

    job = {
        "target": str(target),
        "drafter": str(drafter),
        "method": method,
        "k": int(k),
        "prompts": prompts,
        "max_tokens": int(max_tokens),
        "out": str(out),
    }
    # the bench servers' environment, with the engine in this process (its drafter wrappable)
    env = vllm_environment(
        "cpu",
        os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        cache_root,
        {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    )
    cmd = [sys.executable, "-m", "eagle3_lab.diagnostics.served", "serve", json.dumps(job)]
    logf = open(log_path or os.devnull, "ab")  # noqa: SIM115 - closed below
    try:
        proc = subprocess.run(
            cmd,
            env=env,
            stdout=logf,
            stderr=subprocess.STDOUT,
            timeout=timeout_s,
        )
    finally:
        logf.close()
    if proc.returncode != 0:
        tail = Path(log_path).read_text()[-3000:] if log_path else ""
        raise ReplayError(f"vLLM with the {method} drafter failed (rc {proc.returncode})\n{tail}")
    return read_json(out)


if __name__ == "__main__":
    import json
    import sys

    if len(sys.argv) != 3 or sys.argv[1] != "serve":
        raise SystemExit("usage: python -m eagle3_lab.diagnostics.served serve JOB_JSON")
    _serve_main(json.loads(sys.argv[2]))
