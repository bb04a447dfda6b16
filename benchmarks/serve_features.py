"""What a served EAGLE-3 drafter is fed, against what it was trained on, for a finished run.

    .venv/bin/python benchmarks/serve_features.py --configfile CONFIG [--method eagle3] \\
        [--rows 8] [--generate 48] --out serve_features.json

One drafter server of the run (the bench stage's own, with the run's vLLM settings) records
the aux hidden states its drafter receives (``eagle3_pipeline.engine.serve_probe``):

- **prefill against stored**: for each of ``--rows`` stored rows sent whole as a prompt, the
  features at every position against the extraction's stored ones (what the bench stage's
  check does for one row);
- **decode against prefill**: each row's first half sent as a prompt and ``--generate``
  tokens generated greedily with the drafter; the features of the accepted tokens, computed
  by the verification steps (a decode kernel, few query tokens), against those of the same
  positions when the prompt and the generated tokens are sent again as one prompt (prefill).
  Training only ever saw prefill features.

Relative error per aux layer ‖a - b‖ / ‖b‖ over all compared positions, per row and pooled.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from eagle3_lab.results import write_result
from eagle3_pipeline import config as cfglib
from eagle3_pipeline.bench import features as features_lib
from eagle3_pipeline.bench.stage import speculative_config, start_server
from eagle3_pipeline.engine import serve_probe
from eagle3_pipeline.hidden_states.dataset import read_manifest
from eagle3_pipeline.hidden_states.shards import dequantize, sample_path
from eagle3_pipeline.target.stage import load_info


def completion(base_url: str, model: str, ids: list[int], max_tokens: int) -> list[int]:
    import httpx

    from eagle3_pipeline.server.client import sync_client

    client = sync_client(base_url, timeout=600, max_retries=0)
    body = {
        "model": model,
        "prompt": ids,
        "max_tokens": max_tokens,
        "temperature": 0,
        "return_token_ids": True,
        "ignore_eos": True,
    }
    answer = client.post("/completions", body=body, cast_to=httpx.Response).json()
    return list(answer["choices"][0].get("token_ids") or [])


def recorded(probe_dir: Path, send) -> list[dict]:
    """The calls recorded while ``send()`` ran (the directory emptied first)."""
    for f in probe_dir.glob("call_*.safetensors"):
        f.unlink()
    (probe_dir / serve_probe.ACTIVE).touch()
    try:
        send()
    finally:
        (probe_dir / serve_probe.ACTIVE).unlink(missing_ok=True)
    return serve_probe.read_calls(probe_dir)


def layer_errors(a: np.ndarray, b: np.ndarray, num_aux: int, hidden: int) -> list[float]:
    a = a.reshape(-1, num_aux, hidden)
    b = b.reshape(-1, num_aux, hidden)
    return [
        float(np.linalg.norm(a[:, i] - b[:, i]) / max(np.linalg.norm(b[:, i]), 1e-30))
        for i in range(num_aux)
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configfile", nargs="+", default=["config/config.yaml"])
    ap.add_argument("--method", default="eagle3")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--generate", type=int, default=48)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    config = cfglib.load_files(args.configfile)
    run = Path("results") / config["run"]
    target = load_info(run / "target/target.json")
    manifest = read_manifest(run / "hidden_states")
    drafter_dir = (run / "drafter" / args.method).resolve()
    drafter_cfg = json.loads((drafter_dir / "config.json").read_text())
    aux = list(drafter_cfg["eagle_aux_hidden_state_layer_ids"])
    layer_ids = list(manifest["layer_ids"])
    slots = [layer_ids.index(i) for i in aux]
    hidden = int(manifest["hidden_size"])
    vllm_cfg, bench_cfg = config["vllm"], config["bench"]
    k = bench_cfg["num_speculative_tokens"][0]
    spec_cfg = speculative_config(args.method, drafter_dir, k, bench_cfg)
    probe_dir = features_lib.probe_dir()
    log = Path(args.out).with_suffix(".server.log")
    t0 = time.monotonic()
    server = start_server(
        bench_cfg, vllm_cfg, target, spec_cfg, "the drafter's server", log,
        env=features_lib.probe_env(probe_dir),
    )  # fmt: skip
    model = server.spec.model
    rows_out, prefill_pairs, decode_pairs = [], [], []
    limit = vllm_cfg["max_model_len"] - args.generate - 1
    try:
        index = 0
        while len(rows_out) < args.rows and index < manifest["num_samples"]:
            path = sample_path(manifest["root"], index, manifest["samples_per_shard"])
            index += 1
            if not path.exists():
                continue
            from safetensors.torch import load_file

            tensors = load_file(str(path))
            ids = tensors["token_ids"].tolist()
            if not 8 <= len(ids) <= limit:
                continue
            stored = dequantize(tensors).float().numpy()
            # prefill against stored
            calls = recorded(probe_dir, lambda ids=ids: completion(server.base_url, model, ids, 1))
            served, seen = serve_probe.served_features(calls, ids)
            pre = serve_probe.compare(served, seen, stored, slots)
            prefill_pairs.append(
                (served[seen], stored[seen][:, slots].reshape(int(seen.sum()), -1))
            )
            # decode against prefill: the first half as a prompt, then generated greedily
            prompt = ids[: len(ids) // 2]
            generated: list[int] = []
            calls = recorded(
                probe_dir,
                lambda p=prompt, out=generated: out.extend(
                    completion(server.base_url, model, p, args.generate)
                ),
            )
            sequence = prompt + generated
            dec, dec_seen = serve_probe.served_features(calls, sequence)
            calls = recorded(probe_dir, lambda s=sequence: completion(server.base_url, model, s, 1))
            ref, ref_seen = serve_probe.served_features(calls, sequence)
            both = dec_seen & ref_seen
            both[: len(prompt)] = False  # the prompt's own prefill is the same call shape
            if both.any():
                decode_pairs.append((dec[both], ref[both]))
            rows_out.append(
                {
                    "sample": index - 1,
                    "tokens": len(ids),
                    "prefill_vs_stored": pre,
                    "decode_positions": int(both.sum()),
                    "decode_vs_prefill": layer_errors(dec[both], ref[both], len(slots), hidden)
                    if both.any()
                    else None,
                }
            )
            print(
                f"sample {index - 1}: {len(ids)} tokens, prefill vs stored "
                f"{[round(e, 4) for e in pre['rel_err_per_layer']]}, decode vs prefill "
                f"{rows_out[-1]['decode_vs_prefill']} over {int(both.sum())} positions",
                flush=True,
            )
    finally:
        server.stop()

    def pooled(pairs):
        if not pairs:
            return None
        a = np.concatenate([p[0] for p in pairs])
        b = np.concatenate([p[1] for p in pairs])
        return {"positions": len(a), "rel_err_per_layer": layer_errors(a, b, len(slots), hidden)}

    result = {
        "run": config["run"],
        "target": target["model_path"],
        "architecture": target.get("architecture", {}).get("architectures"),
        "device": vllm_cfg["device"],
        "storage": manifest.get("storage"),
        "aux_layer_ids": aux,
        "k": k,
        "rows": rows_out,
        "prefill_vs_stored": pooled(prefill_pairs),
        "decode_vs_prefill": pooled(decode_pairs),
        "elapsed_s": round(time.monotonic() - t0, 1),
    }
    write_result(args.out, result)
    print(json.dumps({k: result[k] for k in ("prefill_vs_stored", "decode_vs_prefill")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
