#!/usr/bin/env bash
# Build an offline install of vLLM 0.26.0 (the CUDA 13.0 build that pins torch 2.11.0) plus the
# pipeline's own dependencies (lab/gpu/h200-extra-reqs.txt) for a GPU host that has Python 3.12 and
# torch 2.11.0+cu130 but no package index, split into 55 MiB parts: a remote command may carry at
# most 64 MiB, so the parts travel one per command (lab/gpu_host.md).
#
# usage: lab/gpu/build_bundle.sh [OUT]      (default OUT: .gpu, git-ignored)
#   OUT/c01 ... OUT/cNN   one part each
#   OUT/s                 host scripts (acc.sh, install.sh, env.sh) and bundle.env (sizes, sum)
# About 10 minutes on 2 cores (downloads ~800 MB, xz). Needs pip, unzip, xz.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=$(realpath -m "${1:-$REPO/.gpu}")
PLAT=$(cat "$HERE/platforms.txt")
PIPDL=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12
       --implementation cp --abi cp312 --abi abi3 --abi none $PLAT)
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
mkdir -p "$W/w" "$W/d" "$W/vtree" "$W/site"

echo "downloading vllm 0.26.0 and its dependencies"
"${PIPDL[@]}" -d "$W/w" vllm==0.26.0
"${PIPDL[@]}" -d "$W/d" -r "$HERE/vllm-0.26.0-deps.txt"
echo "downloading the pipeline's own dependencies"
grep -vE '^\s*(#|$)' "$REPO/lab/gpu/h200-extra-reqs.txt" | while read -r req; do
  # A few pure-Python packages are published as sdists only (connection_pool): build those
  # here; a pure-Python wheel installs on any platform.
  "${PIPDL[@]}" -d "$W/d" "$req" 2>/dev/null \
    || python3 -m pip wheel -q --no-deps -w "$W/d" "$req"
done

echo "packing vllm (without the FlashAttention-2 kernels: Hopper runs FlashAttention 3)"
(cd "$W/vtree" && unzip -q "$W"/w/vllm-0.26.0-*.whl \
  && rm -f vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so \
           vllm/third_party/deep_gemm/_C.cpython-31[0134]-x86_64-linux-gnu.so \
  && tar -cf - . | xz -T0 -6 > "$W/v.tar.xz")
echo "packing $(ls "$W/d" | wc -l) dependency wheels"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$W/site" --python-version 3.12 \
  --implementation cp --abi cp312 --abi abi3 --abi none $PLAT --only-binary=:all: "$W"/d/*.whl
(cd "$W/site" && tar -cf - . | xz -T0 -6 > "$W/d.tar.xz")

rm -rf "$OUT"; mkdir -p "$OUT/s"
cat "$W/v.tar.xz" "$W/d.tar.xz" | split -b 55m -d -a 2 - "$W/part."
i=0; for p in "$W"/part.*; do i=$((i+1)); c=$(printf '%s/c%02d' "$OUT" $i); mkdir -p "$c"; mv "$p" "$c/"; done
cp "$HERE"/host/* "$OUT/s/"
{ echo "PARTS=$i"
  echo "V_BYTES=$(stat -c %s "$W/v.tar.xz")"; echo "D_BYTES=$(stat -c %s "$W/d.tar.xz")"
  echo "SHA=$(cat "$W/v.tar.xz" "$W/d.tar.xz" | sha256sum | cut -d' ' -f1)"
} > "$OUT/s/bundle.env"
echo "bundle: $i parts in $OUT (c01..$(printf 'c%02d' $i)), $(du -sh "$OUT" | cut -f1)"
