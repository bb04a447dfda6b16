"""Hidden-state writer and validator throughput at real model shapes (random data).

    python benchmarks/hs_io_throughput.py --hidden 4096 7168 --seq 2048 --samples 8

No vLLM needed: torch + safetensors (+ this repo's src). For each hidden size:
  writer     what the connector does per request: (fp8: quantize on the device,) copy to the
             host, safetensors save to disk, rename.
  validator  what the extract client does per sample (``Extractor.store``): read the file,
             parse, shape/ids/finite/zero-row checks, the next-token probe (lm_head of the
             target's vocab on the GPU when there is one), sha256, move into the shard.
GB/s counts bytes of the stored files. Runs on a GPU host (an H200 in results.md)
and on the CPU (slow, for a smoke test with --samples 1 --seq 256).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from eagle3_lab.results import write_result

VOCAB = {4096: 128256, 7168: 163840}  # Llama-3-8B and Kimi-K2 vocabularies


def fake_model(dirpath: Path, hidden: int, vocab: int) -> dict:
    import torch
    from safetensors.torch import save_file

    save_file(
        {
            "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16),
            "lm_head.weight": (torch.randn(vocab, hidden) * 0.02).to(torch.bfloat16),
        },
        str(dirpath / "model.safetensors"),
    )
    return {"rms_norm_eps": 1e-5, "model_type": "llama", "tie_word_embeddings": False}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, nargs="+", default=[4096, 7168])
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--storage", nargs="+", default=["bf16", "fp8"])
    ap.add_argument("--dir", default=None, help="where files go (default: a temp dir)")
    ap.add_argument("--out")
    args = ap.parse_args()

    import torch
    from safetensors.torch import save_file

    from eagle3_pipeline import extract
    from eagle3_pipeline.hidden_states.checks import NextTokenProbe
    from eagle3_pipeline.hidden_states.shards import SCALES_KEY, quantize_fp8

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    results = []
    base = Path(args.dir or tempfile.mkdtemp(prefix="hsio-"))
    for hidden in args.hidden:
        vocab = VOCAB.get(hidden, 32000)
        mdir = base / f"model{hidden}"
        mdir.mkdir(parents=True, exist_ok=True)
        arch = fake_model(mdir, hidden, vocab)
        probe = NextTokenProbe(mdir, arch, "auto")
        rows = [
            {
                "input_ids": torch.randint(0, vocab, (args.seq,)).tolist(),
                "loss_mask": [0] * (args.seq // 4) + [1] * (args.seq - args.seq // 4),
            }
            for _ in range(args.samples)
        ]
        for storage in args.storage:
            root = base / f"hs{hidden}-{storage}"
            staging = root / "staging"
            staging.mkdir(parents=True, exist_ok=True)
            book = extract.ShardBook(root, 1024, range(args.samples))
            ex = extract.Extractor(
                rows,
                book,
                probe,
                list(range(args.layers)),
                hidden,
                {"agreement_positions_per_sample": 256},
                staging,
            )
            w_times, v_times, nbytes = [], [], []
            for i, row in enumerate(rows):
                hs = torch.randn(args.seq, args.layers, hidden, device=dev, dtype=torch.bfloat16)
                if dev == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                if storage == "fp8":
                    q, scale = quantize_fp8(hs)
                    tensors = {"hidden_states": q.cpu(), SCALES_KEY: scale.cpu()}
                else:
                    tensors = {"hidden_states": hs.cpu()}
                tensors["token_ids"] = torch.tensor(row["input_ids"])
                staged = staging / f"req{i}.safetensors"
                save_file(tensors, str(staged) + ".partial")
                os.replace(str(staged) + ".partial", staged)
                t1 = time.perf_counter()
                entry = ex.store(i, str(staged))
                t2 = time.perf_counter()
                book.record(entry)
                w_times.append(t1 - t0)
                v_times.append(t2 - t1)
                nbytes.append(entry["bytes"])
            book.close()
            # the first sample pays for allocator/CUDA warm-up
            w, v = (
                statistics.median(w_times[1:] or w_times),
                statistics.median(v_times[1:] or v_times),
            )
            mb = statistics.median(nbytes)
            r = {
                "hidden": hidden,
                "vocab": vocab,
                "storage": storage,
                "seq": args.seq,
                "layers": args.layers,
                "device": dev,
                "file_mb": mb / 1e6,
                "bytes_per_token": mb / args.seq,
                "writer_gb_s": mb / w / 1e9,
                "validator_gb_s": mb / v / 1e9,
                "validator_tokens_s": args.seq / v,
                "writer_s": w,
                "validator_s": v,
                "validator_s_per_phase": {
                    k: round(x / len(rows), 4) for k, x in ex.timings.items()
                },
            }
            results.append(r)
            print(
                f"hidden {hidden:5d} {storage:5s} {dev}: file {r['file_mb']:.1f} MB "
                f"({r['bytes_per_token']:.0f} B/token); writer {r['writer_gb_s']:.2f} GB/s, "
                f"validator {r['validator_gb_s']:.2f} GB/s = {r['validator_tokens_s']:,.0f} "
                f"tokens/s; per sample {r['validator_s_per_phase']}",
                flush=True,
            )
            shutil.rmtree(root)
    if args.out:
        write_result(args.out, results)


if __name__ == "__main__":
    main()
