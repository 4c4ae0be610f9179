#!/usr/bin/env bash
# The wheels gpu_verl.sh carries for verl 0.9.1 on the H200 box (Python 3.12, no network), fetched here from PyPI
# (the list and why each is needed: tools/gpu/verl_research.md section 2):
#   DIR/small  verl, TransferQueue, Hydra, tensordict, ... ; datasets and multiprocess (TRL's folder is not carried
#              beside it); soundfile, cffi, pycparser and python-multipart, which SGLang's HTTP server imports
#   DIR/ray    Ray 2.60 stripped of its Java jars and dashboard UI (75.6 -> 42.5 MiB: one carry)
#   usage: bash tools/gpu/fetch_verl_wheels.sh [DIR=.gpu-verl-w]   (SGLang's set: fetch_gpu_wheels.sh)
set -euo pipefail
DIR=${1:-.gpu-verl-w}
SMALL=(
  verl==0.9.1 transferqueue==0.1.11 hydra-core==1.3.2 omegaconf==2.3.0 codetiming==1.4.0 tensordict==0.10.0
  pyvers==0.1.0 torchdata==0.11.0 jsonschema==4.26.0 referencing==0.37.0 rpds-py==2026.9.1
  jsonschema-specifications==2025.9.1 cachetools==8.0.2 datasets==5.2.0 "multiprocess<0.70.20"
  soundfile==0.14.0 cffi==2.1.1 pycparser==3.12 python-multipart==0.0.34
)
source "$(dirname "$0")/wheels.sh"
RAW=$(mktemp -d)
trap 'rm -rf "$RAW"' EXIT
mkdir -p "$DIR/small" "$DIR/ray"
download "$DIR/small" "${SMALL[@]}"
# antlr4-python3-runtime 4.9.3 (Hydra, OmegaConf) is an sdist only on PyPI: built here, pure Python
python3 -m pip download -q --no-deps --no-binary :all: antlr4-python3-runtime==4.9.3 -d "$RAW"
python3 -m pip wheel -q --no-deps -w "$DIR/small" "$RAW"/antlr4-python3-runtime-4.9.3.tar.gz
download "$RAW" ray==2.60.0
for whl in "$RAW"/ray-*.whl; do  # Java workers only; the UI needs ray[default]
  python3 "$(dirname "$0")/strip_wheel.py" "$whl" "$DIR/ray/$(basename "$whl")" ray/jars/ ray/dashboard/client/build/
done
du -sh "$DIR"/*
