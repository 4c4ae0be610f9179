# Sourced by the SmolLM2-135M-Instruct GPU scripts (gpu_async.sh, gpu_presets.sh, gpu_close.sh): the first call's
# install and GGUF half, and the model + GSM8K preparation of a later call. Uses $PY and $OUT.
smol_part1() {  # carry folder of wheels (megatron-core cp312, gguf): into /tmp/site; the GGUF's first half into /tmp
  mkdir -p /tmp/site "$OUT" && $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "$1"/*.whl || exit 3
  cp gguf/smollm2.gguf.part1 /tmp/ || exit 4
  nvidia-smi -L; $PY -c "import torch, megatron.core; print(torch.__version__, megatron.core.__version__)"
}

smol_prepare() {  # DIR GGUF [prepare_gsm8k args]: DIR/hf, DIR/mcore (bf16) and DIR/gsm8k, once per machine
  local dir=$1 gguf=$2
  shift 2
  [[ -d $dir/mcore ]] && return 0
  [[ -f $gguf ]] || cat /tmp/smollm2.gguf.part1 gguf/smollm2.gguf.part2 > "$gguf" || exit 4
  echo "=== SmolLM2-135M-Instruct: GGUF -> HF -> megatron; GSM8K ($(date +%T))"
  $PY -m tools.gguf_to_hf --gguf "$gguf" --out $dir/hf --dtype bf16 --overwrite 2>&1 | tail -1
  $PY -m tools.convert_checkpoint hf-to-mcore --hf-dir $dir/hf --out $dir/mcore --dtype bf16 2>&1 | tail -1
  $PY -m tools.prepare_gsm8k --output-dir $dir/gsm8k "$@" | tail -1 || exit 5
}
