#!/usr/bin/env python
"""Build the miniature Kimi-K2.5 (docs/miniature.md).

    .venv/bin/python scripts/build_miniature.py --out DIR [--quantize w4a16|none]
        [--variant wrapper|backbone] [--cache DIR] [--samples N --epochs E]

Trains the tokenizer on the packaged ShareGPT, distils the committed teacher corpus into the
kimi_k25 model and writes DIR (W4A16 routed experts by default). Nothing is downloaded. A
second run with the same inputs finds DIR up to date and returns at once; ``--cache`` keeps the
trained model so that the other quantization or variant is only an export. Prints DIR's
miniature.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from eagle3_pipeline.miniature import build

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the model directory to write")
    ap.add_argument("--quantize", choices=build.QUANTIZE, default="w4a16")
    ap.add_argument("--variant", choices=build.VARIANTS, default="wrapper")
    ap.add_argument("--cache", type=Path, help="keep the trained model here for other exports")
    ap.add_argument("--samples", type=int, help="teacher turns to train on (more: better, slower)")
    ap.add_argument("--epochs", type=int, help="passes over them")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = build.BuildSettings()
    if args.samples or args.epochs:
        train = dataclasses.replace(settings.train, epochs=args.epochs or settings.train.epochs)
        settings = dataclasses.replace(
            settings, samples=args.samples or settings.samples, train=train
        )
    manifest = build.build(
        args.out, quantize=args.quantize, variant=args.variant, settings=settings, cache=args.cache
    )
    print(json.dumps(manifest, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
