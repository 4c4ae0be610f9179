#!/usr/bin/env bash
# Issue 8 on one H200, five device calls on the same warm machine (a call carries at most 64 MiB):
#   part1: megatron-core + the gguf reader + the first half of the SmolLM2-135M-Instruct GGUF (98 MB, split in
#          two: `split -n 2`); GPU tests (decode attention kernel, fp32 logits, graphed decode, decode layer,
#          fused kernels); the GRPO step with rollout.engine=native; ATTN=1 adds the decode-attention
#          micro-benchmark, AB=1 the sdpa A/B, QUICK=1 none of it, EXACT=1 the eager decode with sdpa attention
#   part2: the second GGUF half; SmolLM2 GRPO on GSM8K for $STEPS steps with the native engine in its numeric
#          modes ($MODES; compiled or eager decode x triton or sdpa attention): the rollout-vs-trainer log-prob
#          mismatch on the real model (results: mismatch_smollm2_*.jsonl, mismatch_smollm2.json)
#   part3: SGLang part 1; TRL's GRPOTrainer at the step's shape (W1/trl), right after ours
#   part4: SGLang part 2; the GRPO step with rollout.engine=sglang, and with $SGL_EXTRA (a numerics variant)
#   part5: nothing carried; SmolLM2 with SGLang (bf16 and fp32 LM head), then the mismatch summary of all runs
# Carry folders: W1 (megatron-core in W1/mcore, TRL wheels in W1/trl, SGLang part 1 in W1), W2 (SGLang part 2),
# GG1 / GG2 (smollm2.gguf.part1 / .part2), GGUFW (the gguf wheel), e.g. (2026-12-01, fourth session):
#   run(carry=[".gpu-gguf1", ".gpu-speed-w1/mcore", ".whl"]):
#                                  GG1=.gpu-gguf1 W1=.gpu-speed-w1 bash tools/gpu/gpu_speed_mismatch.sh part1
#   run(carry=[".gpu-gguf2"]):     GG2=.gpu-gguf2 bash tools/gpu/gpu_speed_mismatch.sh part2
#   run(carry=[".gpu-speed-w1"]):  W1=.gpu-speed-w1 bash tools/gpu/gpu_speed_mismatch.sh part3
#   run(carry=[".gpu-speed-w2"]):  W2=.gpu-speed-w2 bash tools/gpu/gpu_speed_mismatch.sh part4
#   run():                         bash tools/gpu/gpu_speed_mismatch.sh part5
# CPU dry run of part2 (tiny sizes, the package's GGUF): DRY=1 OUT=/tmp/dry bash tools/gpu/gpu_speed_mismatch.sh part2
set -uo pipefail
PART=${1:?part1|part2|part3|part4|part5}
STEPS=${STEPS:-2}
SGL_EXTRA=${SGL_EXTRA:-}  # e.g. "--fp32-lm-head 1"
MCORE=${W1:-}/mcore SGL1=${W1:-} SGL2=${W2:-}
source tools/gpu/gpu_env.sh
W=/tmp/mismatch TINY=()

bench() { local name=$1; shift; echo "=== $name ($(date +%T))"
  timeout 330 python3 -m tools.bench.bench_grpo_step "$@" 2>&1 | grep -Ev "rollout: +[0-9]+%" | tee "$OUT/$name.log" | tail -5; }

train() { local name=$1; shift; echo "=== SmolLM2 GSM8K, $name ($(date +%T))"
  timeout "${TRAIN_TIMEOUT:-150}" python3 -m rlhf_mcore.train --config configs/gsm8k_grpo_smollm2.yaml \
      model.hf_path=$W/hf model.load=$W/mcore data.train_files=$W/gsm8k/train.parquet \
      data.val_files=$W/gsm8k/test.parquet trainer.output_dir=$W/"$name" trainer.val_before_train=false \
      trainer.test_freq=-1 trainer.save_freq=0 trainer.resume=disable "trainer.logger=[console,jsonl]" \
      trainer.total_steps="$STEPS" "${TINY[@]}" "$@" 2>&1 | grep -v "Warning\|warnings.warn\|rollout: " \
      | grep "step \|decod\|rror" | tail -$((STEPS + 4)) | cut -c1-240
  cp $W/"$name"/metrics.jsonl "$OUT/mismatch_smollm2_$name.jsonl"; }

summary() { python3 - "$OUT" <<'PYEOF'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1]); summary = {}
keys = ("mismatch_logp_abs_diff", "mismatch_first_abs_diff", "mismatch_exact_frac", "mismatch_kl_k3")
for f in sorted(out.glob("mismatch_smollm2_*.jsonl")):
    rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    entry = {k: [r[f"rollout/{k}"] for r in rows if f"rollout/{k}" in r] for k in keys}
    entry["gen_s"] = [r["timing_s/gen"] for r in rows if "timing_s/gen" in r]
    name = f.stem.removeprefix("mismatch_smollm2_")
    summary[name] = entry
    print(f"{name:<24}" + "  ".join(f"{k.removeprefix('mismatch_')} " + " ".join(f"{v:.5f}" for v in entry[k])
                                     for k in keys) + "  gen s " + " ".join(f"{v:.2f}" for v in entry["gen_s"]))
(out / "mismatch_smollm2.json").write_text(json.dumps(summary, indent=1))
PYEOF
}

smollm2_setup() {  # GGUF $1 -> HF (bf16) -> megatron checkpoint, and GSM8K, under $W
  python3 -m tools.gguf_to_hf --gguf "$1" --out $W/hf --dtype bf16 --overwrite 2>&1 | tail -1
  python3 -m tools.convert_checkpoint hf-to-mcore --hf-dir $W/hf --out $W/mcore --dtype bf16 --overwrite 2>&1 | tail -1
  python3 -m tools.prepare_gsm8k --output-dir $W/gsm8k --max-test 64 2>&1 | tail -1; }

native_modes() {  # the native engine's decode step in numeric modes ($MODES: a subset of the names below)
  for mode in ${MODES:-native native_sdpa native_exact native_eager_triton}; do case $mode in
    native) train native rollout.engine=native ;;
    native_sdpa) train native_sdpa rollout.engine=native rollout.native.decode_attention=sdpa ;;
    native_exact) train native_exact rollout.engine=native rollout.native.compile_decode=false \
                      rollout.native.decode_attention=sdpa ;;
    native_eager_triton) train native_eager_triton rollout.engine=native rollout.native.compile_decode=false ;;
  esac; done; }

if [[ -n ${DRY:-} ]]; then
  export PATH=$PWD/.venv/bin:$PATH
  TINY=(data.train_batch_size=2 rollout.n=2 rollout.max_response_length=8 actor.ppo_mini_batch_size=2
        actor.micro_batch_size_per_gpu=4 reward.num_workers=1)
  mkdir -p "$OUT" && smollm2_setup "$(python3 -c "from tools.gguf_to_hf import find_smollm2_gguf as f; print(f())")"
  native_modes; summary; exit 0
fi
case $PART in
part1)
  mkdir -p /tmp/site && install "$MCORE"/megatron_core*.whl "${GGUFW:-.whl}"/gguf-*.whl || exit 3
  [[ -z ${GG1:-} ]] || cp "$GG1"/smollm2.gguf.part1 /tmp/ || exit 4
  [[ -n ${QUICK:-} ]] && exit 0  # only the installs and the GGUF half (a fresh machine before part2)
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  echo "=== GPU tests ($(date +%T))"
  timeout 240 python3 -m pytest -q -p no:cacheprovider -p no:warnings -m gpu tests/unit/kernels \
      tests/unit/rollout/test_static_decode.py tests/unit/rollout/test_decode_layer.py tests/unit/rollout/test_logprob_agreement.py \
      2>&1 | tail -8
  if [[ -n ${ATTN:-} ]]; then echo "=== decode attention ($(date +%T))"
    timeout 120 python3 -m tools.bench.bench_decode_attention --out "$OUT" 2>&1 | tail -14; fi
  bench native --engine native --steps "${NATIVE_STEPS:-3}" --out "$OUT"
  if [[ -n ${AB:-} ]]; then
    bench native_sdpa_attention --engine native --decode-attention sdpa --steps 1 --out "$OUT/variants/sdpa"; fi
  if [[ -n ${EXACT:-} ]]; then  # the trainer-exact decode: eager functional step, SDPA attention
    bench native_exact --engine native --compile-decode 0 --decode-attention sdpa --steps 1 --out "$OUT/variants/exact"
  fi ;;
part2)
  [[ -f /tmp/smollm2.gguf.part1 && -d /tmp/site/megatron ]] || { echo COLD_MACHINE; exit 9; }
  cat /tmp/smollm2.gguf.part1 "$GG2"/smollm2.gguf.part2 > /tmp/smollm2.gguf || exit 4
  mkdir -p "$OUT" && smollm2_setup /tmp/smollm2.gguf
  native_modes; summary ;;
part3)
  install "$MCORE"/megatron_core*.whl "$SGL1"/*.whl || exit 3
  echo "=== TRL ($(date +%T))"
  TARGET=/tmp/trlsite install "$W1"/trl/*.whl
  PYTHONPATH=/tmp/trlsite timeout 420 python3 -m tools.bench.bench_trl_grpo --out "$OUT" 2>&1 | tr '\r' '\n' \
      | grep -v "it/s\|s/it\]" | tee "$OUT/trl.log" | tail -4 ;;
part4)
  sglang_part part2
  bench sglang --engine sglang --attention-backend flashinfer --steps "${SGL_STEPS:-2}" --out "$OUT"
  if [[ -n $SGL_EXTRA ]]; then
    bench sglang_variant --engine sglang --attention-backend flashinfer --steps 1 $SGL_EXTRA --out "$OUT/variants/sgl"
  fi ;;
part5)
  [[ -d $W/mcore && -d /tmp/site/sglang ]] || { echo COLD_MACHINE; exit 9; }
  mkdir -p "$OUT"
  TRAIN_TIMEOUT=240 train sglang rollout.engine=sglang rollout.sglang.attention_backend=flashinfer
  TRAIN_TIMEOUT=240 train sglang_fp32_lm_head rollout.engine=sglang rollout.sglang.attention_backend=flashinfer \
      rollout.sglang.fp32_lm_head=true
  summary ;;
*) echo "unknown part $PART"; exit 2 ;;
esac
