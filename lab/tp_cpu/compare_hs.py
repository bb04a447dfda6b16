"""Compare the hidden states two extract_tp.py runs stored for the same rows.

    PYTHONPATH=$PWD/src .venv/bin/python lab/tp_cpu/compare_hs.py \
        tp_cpu/extract_tp1 tp_cpu/extract_tp3 \
        --json benchmarks/results/tensor_parallel/compare_tp1_tp3.json

Per layer: relative error (Frobenius norm of the difference over the row / norm of A's row;
max and mean over rows, the metric of verify.reference_errors) and the fraction of stored bf16
values that are bit-identical. Next-token agreement of lm_head(norm(h_final)) with the row's
next token at every completion position (not only the stage's 64 sampled positions), for A and
B, and how often A's and B's argmax agree with each other.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--json")
    ap.add_argument("--target", default="results/default/target/target.json")
    args = ap.parse_args()

    import torch
    from datasets import load_from_disk
    from safetensors.torch import load_file

    from eagle3_pipeline.hidden_states import shards
    from eagle3_pipeline.hidden_states.checks import NextTokenProbe
    from eagle3_pipeline.runtime.files import read_json
    from eagle3_pipeline.target import load_info

    a, b = Path(args.a), Path(args.b)
    ma, mb = read_json(a / "part.json"), read_json(b / "part.json")
    if ma["layer_ids"] != mb["layer_ids"]:
        raise SystemExit(f"layer ids differ: {ma['layer_ids']} vs {mb['layer_ids']}")
    layer_ids = ma["layer_ids"]
    S = ma["samples_per_shard"]
    ds = load_from_disk(str(a / "dataset")).with_format(None)
    ds_b = load_from_disk(str(b / "dataset")).with_format(None)
    n = min(len(ds), len(ds_b))
    target = load_info(args.target)
    probe = NextTokenProbe(target["model_path"], target["architecture"], "cpu")

    per_layer = {str(layer): [] for layer in layer_ids}
    same_bits = {str(layer): [] for layer in layer_ids}
    hits_a = hits_b = cross = checked = 0
    tokens = 0
    for i in range(n):
        if ds[i]["input_ids"] != ds_b[i]["input_ids"]:
            raise SystemExit(f"row {i} differs between the two runs' datasets")
        ta = load_file(shards.sample_path(a / "hs", i, S))
        tb = load_file(shards.sample_path(b / "hs", i, S))
        if not torch.equal(ta["token_ids"], tb["token_ids"]):
            raise SystemExit(f"row {i}: stored token ids differ")
        ha, hb = ta["hidden_states"], tb["hidden_states"]
        tokens += ha.shape[0]
        for j, lid in enumerate(layer_ids):
            x, y = ha[:, j].float(), hb[:, j].float()
            per_layer[str(lid)].append(float((y - x).norm() / x.norm().clamp_min(1e-12)))
            same_bits[str(lid)].append(float((ha[:, j] == hb[:, j]).float().mean()))
        ids, mask = ds[i]["input_ids"], ds[i]["loss_mask"]
        pos = [p for p in range(len(ids) - 1) if mask[p + 1]]
        if pos:
            idx = torch.tensor(pos)
            nxt = torch.tensor([ids[p + 1] for p in pos])
            pa = probe.predict(ha[idx, -1]).argmax(-1)
            pb = probe.predict(hb[idx, -1]).argmax(-1)
            hits_a += int((pa == nxt).sum())
            hits_b += int((pb == nxt).sum())
            cross += int((pa == pb).sum())
            checked += len(pos)

    result = {
        "a": str(a),
        "b": str(b),
        "rows": n,
        "tokens": tokens,
        "layer_ids": layer_ids,
        "rel_error_max_per_layer": {k: max(v) for k, v in per_layer.items()},
        "rel_error_mean_per_layer": {k: sum(v) / len(v) for k, v in per_layer.items()},
        "bf16_identical_fraction_per_layer": {k: sum(v) / len(v) for k, v in same_bits.items()},
        "next_token_positions": checked,
        "next_token_agreement_a": hits_a / checked if checked else None,
        "next_token_agreement_b": hits_b / checked if checked else None,
        "argmax_a_equals_b": cross / checked if checked else None,
        "stage_verification_a": ma["verification"],
        "stage_verification_b": mb["verification"],
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        from eagle3_lab.results import write_result

        write_result(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
