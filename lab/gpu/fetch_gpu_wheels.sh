#!/usr/bin/env bash
# Wheels that benchmarks/train_throughput.py needs on the H200 machine (Python 3.12, torch 2.11,
# transformers 5.17, no speculators/vllm/snakemake, no registry access). Installed there with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
# Versions are the ones of the project's CPU lock where they exist. Pure-python wheels except
# jiter, pydantic-core and zstandard (cp312 manylinux). datasets 5.1 needs pyarrow >= 24: pass
# --with-pyarrow if the machine's pyarrow is older (about 45 MB more; the working tree that
# travels may hold 64 MiB).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p .whl
grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || grep -qxF '/.whl/' .gitignore || echo '/.whl/' >> .git/info/exclude
pkgs=(
  speculators==0.9.0 hs-connectors==0.9.0
  datasets==5.1.0 dill==0.4.1 multiprocess==0.70.19 fsspec==2026.7.0
  loguru==0.7.3
  openai==2.54.0 distro==1.9.0 jiter==0.19.0 sniffio==1.3.1
  pydantic==2.14.4 pydantic-core==2.50.5 pydantic-settings==2.16.3 python-dotenv==1.2.4
  typing-inspection==0.4.5 annotated-types==0.8.0 typing-extensions==4.16.0
  zstandard==0.25.0
)
if [[ "${1:-}" == "--with-pyarrow" ]]; then pkgs+=(pyarrow==26.0.1); fi
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d .whl "${pkgs[@]}"
ls -1 .whl
du -sh .whl
