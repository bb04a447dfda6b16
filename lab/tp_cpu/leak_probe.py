"""What get_finished_count does under tensor parallelism: start the extraction server exactly as
the extract stage does (extract.server_spec), optionally with the connector's override removed
(no_override_connector.py, next to this script), a small KV cache (--num-gpu-blocks-override),
and send rows one at a time. After each request: its latency, whether the hidden-states file
arrived, and the server's KV-cache usage and running/waiting request counts from /metrics. Stops
at the first request that times out. Then the CPU time each server process uses over an idle
window.

    PYTHONPATH=$PWD/src:$PWD/lab/tp_cpu .venv/bin/python lab/tp_cpu/leak_probe.py \
        --tp 3 --connector no_override --blocks 24 --rows 16 --timeout 90 \
        --json benchmarks/results/tensor_parallel/leak_tp3_no_override.json
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import shutil
import sys
import time
from pathlib import Path

CONNECTORS = {
    "pipeline": ("PipelineHiddenStatesConnector", "eagle3_pipeline.hidden_states.connector"),
    "no_override": ("NoOverrideConnector", "no_override_connector"),
}


def metric(text: str, name: str) -> float | None:
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, re.M)
    return float(m.group(1)) if m else None


def idle_cpu(root_pid: int, seconds: float) -> dict[str, float]:
    """CPU seconds per second each process of the server's tree used over an idle window (no
    request in flight): an engine spinning on unfinished requests shows up here."""
    import psutil

    procs = [psutil.Process(root_pid), *psutil.Process(root_pid).children(recursive=True)]

    def cpu(p):
        t = p.cpu_times()
        return t.user + t.system

    before = {p.pid: cpu(p) for p in procs}
    t0 = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - t0  # longer than asked when this process waits for a core
    return {
        f"{p.pid}:{p.name()}": round((cpu(p) - before[p.pid]) / elapsed, 3)
        for p in procs
        if p.is_running()
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", default="results/default")
    ap.add_argument("--config", default="config/config.yaml")
    ap.add_argument("--tp", type=int, required=True)
    ap.add_argument("--connector", choices=sorted(CONNECTORS), required=True)
    ap.add_argument("--blocks", type=int, default=40, help="--num-gpu-blocks-override")
    ap.add_argument("--rows", type=int, default=12)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--idle-s", type=float, default=15.0)
    ap.add_argument("--out", default="tp_cpu/leak")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stdout)

    from datasets import load_from_disk

    from eagle3_lab.results import write_result
    from eagle3_pipeline import config, extract
    from eagle3_pipeline.server import VllmServer
    from eagle3_pipeline.server import client as client_lib
    from eagle3_pipeline.target import load_info

    cfg = config.load(args.config)
    run = Path(args.run)
    target = load_info(run / "target" / "target.json")
    _, captured, final = extract.resolve_layers(cfg["extract"], target["architecture"])
    out = Path(args.out).resolve() / f"tp{args.tp}_{args.connector}"
    shutil.rmtree(out, ignore_errors=True)
    staging = out / "staging"
    staging.mkdir(parents=True)
    ecfg = dict(cfg["extract"], server_args=["--num-gpu-blocks-override", str(args.blocks)])
    spec = extract.server_spec(
        dict(cfg["vllm"], tensor_parallel_size=args.tp), target, [*captured, final], staging, ecfg
    )
    name, module = CONNECTORS[args.connector]
    spec.kv_transfer_config = dict(
        spec.kv_transfer_config, kv_connector=name, kv_connector_module_path=module
    )
    ds = load_from_disk(str(run / "prepare" / "dataset")).with_format(None)

    steps = []
    result = {
        "tp": args.tp,
        "connector": f"{module}.{name}",
        "num_gpu_blocks_override": args.blocks,
        "kv_cache_tokens": None,
        "timeout_s": args.timeout,
        "requests": steps,
    }
    with VllmServer(spec, out / "server.log") as server:
        log_text = (out / "server.log").read_text(errors="replace")
        m = re.search(r"CPU KV cache size: ([\d,]+) tokens", log_text)
        result["kv_cache_tokens"] = int(m.group(1).replace(",", "")) if m else None
        with client_lib.sync_client(server.base_url, timeout=args.timeout, max_retries=0) as c:
            for i in range(args.rows):
                ids = ds[i]["input_ids"]
                t0 = time.monotonic()
                step = {"row": i, "tokens": len(ids)}
                path = None
                try:
                    res = c.completions.create(
                        model=server.model_name,
                        prompt=ids,
                        max_tokens=1,
                        extra_body={"return_token_ids": True},
                    )
                    params = getattr(res, "kv_transfer_params", None) or (
                        res.model_extra or {}
                    ).get("kv_transfer_params")
                    path = (params or {}).get("hidden_states_path")
                    step["ok"] = True
                except Exception as e:  # a timeout is the finding, not an error of the probe
                    step["ok"] = False
                    step["error"] = f"{type(e).__name__}: {e}"
                step["latency_s"] = round(time.monotonic() - t0, 2)
                time.sleep(1.0)  # let the engine run a step or two after the response
                if step["ok"]:  # written asynchronously after the response: looked at now
                    step["hidden_states_file"] = bool(path and Path(path).exists())
                text = client_lib.get_text(c, "/metrics")
                step["kv_cache_usage"] = metric(text, "vllm:kv_cache_usage_perc")
                step["running"] = metric(text, "vllm:num_requests_running")
                step["waiting"] = metric(text, "vllm:num_requests_waiting")
                steps.append(step)
                print(json.dumps(step), flush=True)
                if not step["ok"]:
                    break
        result["idle_cpu_s_per_s"] = idle_cpu(server.proc.pid, args.idle_s)
        result["idle_window_s"] = args.idle_s
    write_result(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
