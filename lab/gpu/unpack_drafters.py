"""Put drafters copied off a GPU host back together (lab/gpu/pack_results.py).

    .venv/bin/python lab/gpu/unpack_drafters.py FETCHED/RUN-drafters-NAME.tar.part* \
        --into /tmp/home --target-model tests/.cache/target-bfloat16/model

Joins the parts (in name order), unpacks them under --into (results/RUN/drafter/NAME/...) and
gives each drafter packed with --slim its frozen embeddings back from the target model, after
checking that the target's tensor is byte for byte the one the drafter was trained with (the
checksum packed with it): a target of another dtype or version is refused.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
from pathlib import Path

# run as a script, its own directory is first on the import path
from pack_results import EMBED, tensor_sha256


def target_embeddings(model_dir: Path):
    from safetensors import safe_open

    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(f, framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 - a safe_open handle is not iterable
                if name.endswith(EMBED):
                    return fh.get_tensor(name)
    sys.exit(f"{model_dir}: no {EMBED} in its safetensors files")


def restore(weights: Path, ident: dict, model_dir: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    embed = target_embeddings(model_dir).to(getattr(torch, ident["dtype"]))
    if list(embed.shape) != ident["shape"] or tensor_sha256(embed) != ident["sha256"]:
        sys.exit(
            f"{weights}: the target's {EMBED} ({embed.dtype}, {list(embed.shape)}) is not the "
            f"one this drafter was trained with ({ident['dtype']}, {ident['shape']}): "
            "materialize the run's target (its target.dtype) and pass its model directory"
        )
    tensors = load_file(weights)
    tensors[EMBED] = embed
    save_file(tensors, weights, metadata={"format": "pt"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("parts", nargs="+", type=Path)
    ap.add_argument("--into", type=Path, required=True)
    ap.add_argument("--target-model", type=Path, help="needed for drafters packed with --slim")
    args = ap.parse_args()
    data = b"".join(p.read_bytes() for p in sorted(args.parts, key=lambda p: p.name))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(args.into, filter="data")
        names = tar.getnames()
    for name in names:
        if not name.endswith(".embed.json"):
            continue
        if args.target_model is None:
            sys.exit(f"{name}: packed without its embeddings; pass --target-model")
        meta = args.into / name
        restore(
            meta.with_name(meta.name.removesuffix(".embed.json")),
            json.loads(meta.read_text()),
            args.target_model,
        )
        meta.unlink()
        print(f"restored {EMBED} of {meta.parent}")
    print(f"unpacked {len(names)} files under {args.into}")


if __name__ == "__main__":
    main()
