#!/usr/bin/env bash
# The Kimi-K2.5 miniature for the GPU host, with its routed experts in W4A16 (compressed-tensors,
# group 32: the format Kimi-K2.5 ships, which vLLM serves with its Marlin WNA16 MoE kernel),
# packed in parts small enough to carry: .gpu/mini/kimi-miniature.tar.xz.part-NN. The host
# unpacks them to /tmp/w/repo/models/kimi-miniature (lab/gpu/steps.sh, km_* steps).
#   bash lab/gpu/pack_miniature.sh        (from the checkout's root, after scripts/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=build/kimi-miniature
.venv/bin/python scripts/build_miniature.py --out "$out" --quantize w4a16 \
    --cache tests/.cache/miniature
.venv/bin/python lab/gpu/miniature_quantized.py "$out"
rm -rf .gpu/mini && mkdir -p .gpu/mini
tar -C "$(dirname "$out")" -cJf - "$(basename "$out")" | split -b 40M -d - .gpu/mini/kimi-miniature.tar.xz.part-
ls -l .gpu/mini
