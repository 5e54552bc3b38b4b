#!/usr/bin/env bash
# Every GPU figure blocklab states, measured in one command, for the few minutes a GPU is lent (issue 38):
#
#   scripts/gpu-check.sh                         # the first CUDA GPU: tests, block, training, generation
#   scripts/gpu-check.sh --device cuda:1         # another GPU
#   scripts/gpu-check.sh --device cpu --quick    # every part at toy sizes on the CPU (CI runs this)
#
# Needs nothing but the repository: make creates .venv with the test extra first (on a GPU machine pip
# installs PyPI's CUDA build of torch), then benchmarks/gpu_check.py prints one table of ratios against
# peers measured in the same run and writes them as JSON to runs/gpu-check/report.json (--out DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
make --no-print-directory .venv/.installed
exec .venv/bin/python benchmarks/gpu_check.py "$@"
