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
  soundfile cffi pycparser python-multipart
)
download() {  # DIR SPEC...: cp312 manylinux wheels, no dependencies
  local dir=$1; shift
  local plat=()
  for p in manylinux_2_34 manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_24 manylinux_2_17 \
           manylinux2014 manylinux_2_5 manylinux1; do plat+=(--platform "${p}_x86_64"); done
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      "${plat[@]}" -d "$dir" "$@"
}
RAW=$(mktemp -d)
trap 'rm -rf "$RAW"' EXIT
mkdir -p "$DIR/small" "$DIR/ray"
download "$DIR/small" "${SMALL[@]}"
# antlr4-python3-runtime 4.9.3 (Hydra, OmegaConf) is an sdist only on PyPI: built here, pure Python
python3 -m pip download -q --no-deps --no-binary :all: antlr4-python3-runtime==4.9.3 -d "$RAW"
python3 -m pip wheel -q --no-deps -w "$DIR/small" "$RAW"/antlr4-python3-runtime-4.9.3.tar.gz
download "$RAW" ray==2.60.0
python3 - "$RAW" "$DIR/ray" <<'PYEOF'
import glob, os, sys, zipfile
raw, out = sys.argv[1], sys.argv[2]
drop = ("ray/jars/", "ray/dashboard/client/build/")  # Java workers only; the UI needs ray[default]
for src in glob.glob(os.path.join(raw, "ray-*.whl")):
    dst = os.path.join(out, os.path.basename(src))
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            if info.filename.startswith(drop):
                continue
            data = zin.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = b"".join(line + b"\n" for line in data.splitlines()
                                if line and not line.decode().startswith(drop))
            zout.writestr(info, data)
    print(f"{dst}: {os.path.getsize(dst) / 2**20:.1f} MiB")
PYEOF
du -sh "$DIR"/*
