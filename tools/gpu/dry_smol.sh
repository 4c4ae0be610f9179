# Sourced by the GPU scripts' CPU dry runs (DRY=1): `dry_smol DIR` makes a tiny SMOL layout in DIR once, from the
# local SmolLM2 GGUF (the real tokenizer and weights, fp32) and 64 GSM8K train rows: DIR/hf, DIR/mcore,
# DIR/gsm8k/{train,test}.parquet, as call B's preparation lays out $SMOL on the box. Uses $PY.
dry_smol() {
  local dir=$1 gguf
  [[ -d $dir/mcore ]] && return 0
  gguf=$($PY -c "from tools.gguf_to_hf import find_smollm2_gguf as f; print(f())")
  $PY -m tools.gguf_to_hf --gguf "$gguf" --out $dir/hf --dtype fp32 --overwrite 2>&1 | tail -1
  $PY -m tools.convert_checkpoint hf-to-mcore --hf-dir $dir/hf --out $dir/mcore --dtype fp32 2>&1 | tail -1
  $PY -m tools.prepare_gsm8k --output-dir $dir/gsm8k --max-train 64 --max-test 4 | tail -1
}
