#!/usr/bin/env bash
# Issue 43 on one H200: vision-language RL (Qwen2.5-VL) on CUDA, one call (< 540 s), carry .gpu-async-w
# (megatron-core cp312 + gguf wheels):
#   bash tools/gpu/gpu_vlm.sh
# (a) the vision tests on CUDA (tests/unit/trainer/test_vision_training.py, tests/unit/rollout/test_vision_rollout.py:
#     log-probs vs transformers, packed vs padded gradients, rollout vs trainer log-probs; fp32 on the GPU; and the
#     multi-turn VLM test of tests/dist/trainer/test_multi_turn_train.py, eager and CUDA-graphed; the static
#     decoder's tests, tests/unit/rollout/test_static_decode.py, whose GPU cases capture the graphs);
# (b) the tiny VLM preset (configs/tiny_vlm_grpo.yaml: 40 steps, greedy validation before, at 20 and at the end)
#     for at most PRESET_S seconds;
# (c) one GRPO step at the Qwen2.5-VL-3B shape (config.json built below: LM 36 layers x 2048, vision tower depth 32
#     x 1280, out 2048), random bf16 weights drawn on the GPU (LM and tower), 32 prompts x 8 samples, each prompt
#     one 448 x 448 noise image (256 LM tokens) + text = 384 prompt tokens, 256 new tokens, micro-batch 16,
#     2 mini-batches (the old-log-prob pass runs), CUDA-graphed decode (GRAPHS=0: eager), 1 warm-up
#     + 2 timed steps (tools/bench/bench_grpo_step.py --images 1). Reported: step and phase seconds, rollout
#     tokens/s (the step's gen phase), MFU of the log-prob + update passes with the tower's FLOPs and of the LM
#     only, peak memory, and the memory plan's prediction per phase (LM + the tower's weights).
# ENGINE=sglang: (b) and (c) roll out through the embedded SGLang engine (rollout/sglang_images.py) instead; SGLang
# first, on the same warm machine: MCORE=.gpu-speed-w1/mcore SGL1=.gpu-speed-w1 bash -c 'source tools/gpu/gpu_env.sh;
# sglang_part part1' (carry .gpu-speed-w1), then this script with SGL2=.gpu-speed-w2 (carry .gpu-speed-w2).
# BENCH_SET=A.B=VALUE: one more config override for (c) (e.g. rollout.native.keep_graphs=false).
# FAMILY=qwen3_vl: (b) is configs/tiny_vlm3_grpo.yaml and (c) the Qwen3-VL-4B shape (LM 36 x 2560, tower 24 x 1024 with
# DeepStack, patch 16: a 448 x 448 image is 196 LM tokens). FAMILY=qwen3_vl_moe: configs/tiny_vlm3_moe_grpo.yaml and
# Qwen3-VL-30B-A3B's layers cut to 4 LM layers (128 experts top-8, tower 27 x 1152; 3.6 B parameters: an H200), the
# MoE decoded eagerly (GRAPHS has no effect on it).
# $OUT: tests.log, tiny_vlm/ (the preset's run: metrics.jsonl), LABEL/grpo_step_part_<engine>_LABEL.json and
# vlm_LABEL.json (LABEL: qwen25vl3b or qwen3vl4b).
# CPU dry run (the tiny VLM's shape, fp32, 56 x 56 images; seconds):
#   DRY=1 OUT=/tmp/dry_vlm PY=.venv/bin/python bash tools/gpu/gpu_vlm.sh
set -uo pipefail
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
log() { echo "=== $* ($(date +%T), ${SECONDS}s)"; }
mkdir -p "$OUT"
if [[ -z "${DRY:-}" ]]; then
  export PYTHONPATH=/tmp/site:$PWD
  [[ -d /tmp/site/megatron ]] || { mkdir -p /tmp/site && $PY -m pip install -q --no-index --no-deps --no-compile \
      --no-cache-dir --upgrade --target /tmp/site .gpu-async-w/*.whl || exit 3; }
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
else
  export PYTHONPATH=$PWD
fi
ENGINE=${ENGINE:-native}
FAMILY=${FAMILY:-qwen2_5_vl}  # qwen3_vl: the tiny Qwen3-VL preset and the Qwen3-VL-4B shape (patch 16: 196 tokens)
declare -A PRESETS=([qwen2_5_vl]=tiny_vlm_grpo [qwen3_vl]=tiny_vlm3_grpo [qwen3_vl_moe]=tiny_vlm3_moe_grpo)
declare -A SHAPES=([qwen2_5_vl]=qwen2.5-vl-3b [qwen3_vl]=qwen3-vl-4b [qwen3_vl_moe]=qwen3-vl-30b-a3b-4l)
declare -A TINY_DIRS=([qwen2_5_vl]="tiny_vlm 56" [qwen3_vl]="tiny_vlm3 64" [qwen3_vl_moe]="tiny_vlm3_moe 64")
SHAPE_NAME=${SHAPES[$FAMILY]:?FAMILY: qwen2_5_vl, qwen3_vl or qwen3_vl_moe}
LABEL=${SHAPE_NAME//[.-]/}  # qwen25vl3b, qwen3vl4b, qwen3vl30ba3b4l
if [[ $ENGINE == sglang && -z "${DRY:-}" ]]; then
  source tools/gpu/gpu_env.sh && sglang_part part2  # SGLang's second half (the first: see the header)
fi
TESTS_S=${TESTS_S:-150} PRESET_S=${PRESET_S:-75} BENCH_S=${BENCH_S:-260}  # + ~20 s install: ~505 s at most
# (each 0: skip that part; PRESET_S=0 BENCH_S=0: the tests alone, ~100 s)

if [[ $TESTS_S -gt 0 ]]; then  # TESTS_S=0: skip (a), e.g. for ENGINE=sglang once the native call has run them
  log "(a) vision tests on $([[ -n "${DRY:-}" ]] && echo CPU || echo CUDA)"
  timeout -k 5 "$TESTS_S" $PY -m pytest -q -p no:cacheprovider -rs tests/unit/trainer/test_vision_training.py \
      tests/unit/rollout/test_vision_rollout.py tests/dist/trainer/test_multi_turn_train.py \
      tests/unit/rollout/test_static_decode.py -k "vision or static_decode" > "$OUT/tests.log" 2>&1
  echo "tests: rc $?"; grep "passed\|failed\|error\|SKIP" "$OUT/tests.log" | tail -6
fi

if [[ $PRESET_S -gt 0 ]]; then  # PRESET_S=0: skip (b)
  log "(b) tiny VLM preset (at most ${PRESET_S}s)"
  PRESET=(trainer.output_dir="$OUT/tiny_vlm" rollout.engine=$ENGINE)
  [[ -n "${DRY:-}" ]] && PRESET+=(trainer.total_steps=2 trainer.val_before_train=false)
  timeout -k 5 "$PRESET_S" $PY -m rlhf_mcore.train --config configs/${PRESETS[$FAMILY]}.yaml "${PRESET[@]}" \
      > "$OUT/tiny_vlm.log" 2>&1
  echo "preset: rc $?"; grep -i "val\|step 40\|step 20\|Error\|Traceback" "$OUT/tiny_vlm.log" | grep -v Warn | tail -8
fi

[[ $BENCH_S -gt 0 ]] || { log "done (BENCH_S=0: no step)"; exit 0; }
log "(c) GRPO step at the $SHAPE_NAME shape (at most ${BENCH_S}s)"
HF=/tmp/$SHAPE_NAME
read -r TINY_DIR TINY_SIDE <<< "${TINY_DIRS[$FAMILY]}"
$PY - "$HF" "$SHAPE_NAME" "${DRY:+$TINY_DIR}" "$TINY_SIDE" <<'EOF'
import json, sys
from tools.bench.vision_bench import SHAPES, write_vlm_dir
if sys.argv[3]:  # the tiny VLM's shape and image side
    write_vlm_dir(sys.argv[1], json.load(open(f"data/{sys.argv[3]}/config.json")), int(sys.argv[4]))
else:
    write_vlm_dir(sys.argv[1], SHAPES[sys.argv[2]], 448)
EOF
if [[ -n "${DRY:-}" ]]; then
  SHAPE=(--tiny --image-side $TINY_SIDE)
else
  SHAPE=(--prompts 32 --n 8 --prompt-len 384 --new-tokens 256 --micro-batch 16 --image-side 448 --gpu-init 1)
fi
[[ $ENGINE == sglang ]] && cp data/tiny_vlm/{tokenizer.json,tokenizer_config.json,chat_template.jinja} "$HF"/  # its
# multimodal processor loads a tokenizer even without tokenizer init; the ids are ours
timeout -k 5 "$BENCH_S" $PY -m tools.bench.bench_grpo_step --engine $ENGINE --hf-path "$HF" --images 1 \
    --cuda-graphs ${GRAPHS:-1} --mini-batches 2 --steps 2 --warmup 1 --standalone 0 --label $LABEL --out "$OUT/$LABEL" \
    "${SHAPE[@]}" ${BENCH_SET:+--set "$BENCH_SET"} > "$OUT/$LABEL.log" 2>&1
echo "bench: rc $?"
grep -v "Warning\|warnings.warn" "$OUT/$LABEL.log" | grep -A6 "step [0-9]:\|phase  predicted\|Error\|Traceback" | tail -16

log "summary"
$PY - "$OUT" "$LABEL" <<'EOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
found = sorted((out / sys.argv[2]).glob("grpo_step_part_*.json"))
if not found:
    sys.exit("no bench result")
r = json.loads(found[0].read_text())
ph = r["phases_s"]
keys = ("step_s", "rollout_tok_s_in_step", "logprob_update_mfu", "logprob_update_mfu_lm_only", "update_mfu",
        "tower_tflop_per_step", "peak_mem_gib", "mismatch", "memory_plan", "device")
(out / f"vlm_{sys.argv[2]}.json").write_text(json.dumps({k: r.get(k) for k in keys} | {"phases_s": ph}, indent=2))
fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
print(f"step {r['step_s']:.2f} s (gen {ph['gen']:.2f}, old log-prob {ph['old_log_prob']:.2f}, update "
      f"{ph['update_actor']:.2f}, sync {ph['sync_weights']:.2f}); rollout {r['rollout_tok_s_in_step']:.0f} tok/s; "
      f"MFU {fmt(r['logprob_update_mfu'], '.1%')} with the tower ({r['tower_tflop_per_step']:.0f} TFLOP a step), "
      f"{fmt(r['logprob_update_mfu_lm_only'], '.1%')} LM only; peak {fmt(r['peak_mem_gib'], '.1f')} GiB; "
      f"mismatch {fmt(r['mismatch']['rollout/mismatch_logp_abs_diff'], '.5f')}")
for m in r["memory_plan"]:
    print(f"  plan {m['phase']:<10} predicted {m['predicted_gib']:6.2f} GiB, measured {fmt(m['measured_gib'], '6.2f')}")
print(f"wrote {out / f'vlm_{sys.argv[2]}.json'}")
EOF
log "done"
