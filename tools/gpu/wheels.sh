# Sourced by fetch_gpu_wheels.sh and fetch_verl_wheels.sh: the box's wheels (Python 3.12, manylinux x86_64).
download() {  # DIR SPEC...: cp312 manylinux wheels, no dependencies
  local dir=$1; shift
  local plat=()
  for p in manylinux_2_34 manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_24 manylinux_2_17 \
           manylinux2014 manylinux_2_5 manylinux1; do plat+=(--platform "${p}_x86_64"); done
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      "${plat[@]}" -d "$dir" "$@"
}
