#!/usr/bin/env bash
# The whole test suite on a lent GPU machine again, at a later commit than check.sh's first call: --device auto picks
# CUDA there and tests/test_cuda_graph.py runs instead of skipping. Wheels for what the machine lacks (gymnasium,
# ale-py, tyro, tensorboard, matplotlib, pytest-xdist and their dependencies; not moviepy, whose ffmpeg wheel is too
# large to carry, nor rliable and its stack) are downloaded here into the git-ignored .whl/ and carried:
#   pip download -d .whl --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
#     --platform manylinux2014_x86_64 --implementation cp gymnasium==1.4.0 ale-py==0.12.1 tyro==1.0.16 \
#     tensorboard==2.21.0 numpy==2.4.6 matplotlib==3.11.2 pytest==9.2.0 pytest-xdist
#   COMMIT=$(git rev-parse --short HEAD) bash results/gpu_check/suite.sh    # on the GPU machine; OUT=<dir> for outputs
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; python3 --version
  python3 -c "import torch; print(torch.__version__, torch.cuda.is_available())"; echo "commit ${COMMIT:-?}"; } \
  | tee "$OUT/machine_suite.txt"
timeout "${PYTEST_SECONDS:-330}" python3 -m pytest -q -n "${WORKERS:-14}" -p no:cacheprovider -rfEs tests \
  >"$OUT/pytest_suite.txt" 2>&1
echo "pytest rc $?"; tail -n 40 "$OUT/pytest_suite.txt"
