#!/usr/bin/env bash
# One node: launch the SPMD trainer on every local GPU (or NPROC CPU ranks).
#   launch/torchrun.sh configs/gsm8k_grpo_smollm2.yaml [a.b=value ...]
#   launch/torchrun.sh a.b=value ...                     # no config file: the defaults plus the overrides
#   NPROC=2 DRY_RUN=1 launch/torchrun.sh configs/tiny_grpo.yaml trainer.total_steps=2   # print, don't run
# The config is checked first (--validate-only, a few seconds): bad input stops here with exit 2, once.
# A rank that dies (kill -9, OOM, a crash) makes torchrun restart every rank, up to MAX_RESTARTS (3) times (never for
# exit 2, bad input: rlhf_mcore.launcher); each
# attempt resumes from the newest intact checkpoint (trainer.resume=auto, put before your overrides so that an
# explicit trainer.resume=... still wins; MAX_RESTARTS=0 while debugging a run that fails at start-up).
# SIGTERM/SIGINT to torchrun is passed on to the ranks, which save and exit 7 (no restart);
# TORCH_ELASTIC_SHUTDOWN_TIMEOUT (s, 120 here) is how long torchrun waits for that save before SIGKILL.
# The console shows local rank 0's output; the other ranks write theirs to LOG_DIR (runs/torchrun)/<run id>/
# attempt_<n>/<local rank>/{stdout,stderr}.log, and a rank that fails is named in torchrun's summary with its exit
# code and traceback.
set -euo pipefail
CONFIG=()
# a config file first, or overrides only (Hydra flags and ~key too)
if [[ $# -gt 0 && $1 != *=* && $1 != -* && $1 != "~"* ]]; then CONFIG=(--config "$1"); shift; fi
if [[ -z "${NPROC:-}" ]]; then
  if command -v nvidia-smi >/dev/null 2>&1; then NPROC=$(nvidia-smi -L | wc -l); else NPROC=1; fi
fi
PYTHON=${PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}  # the repo's venv (`make venv`)
if [[ ! -x "$PYTHON" ]]; then
  echo "torchrun.sh: $PYTHON not found (run \`make venv\`, or set PYTHON=...); using python3" >&2
  PYTHON=python3
fi
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-120}
# a fresh rendezvous store per attempt: the shared one keeps the dead attempt's keys (gloo's peer addresses)
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-1}
OTHERS=$(seq -s, -f %g:3 1 $((NPROC - 1)))  # 1:3,2:3,...: both streams of local ranks 1.. to their log files
CMD=("$PYTHON" -m rlhf_mcore.launcher --standalone --nproc_per_node "$NPROC" --max-restarts "${MAX_RESTARTS:-3}"
     --local-ranks-filter 0 --redirects "${OTHERS:-0}" --log-dir "${LOG_DIR:-runs/torchrun}"
     -m rlhf_mcore.train "${CONFIG[@]}" trainer.resume=auto "$@")
if [[ -n "${DRY_RUN:-}" ]]; then printf '%q ' "${CMD[@]}"; echo; exit 0; fi
"$PYTHON" -m rlhf_mcore.train "${CONFIG[@]}" --validate-only trainer.resume=auto "$@" >/dev/null || exit $?
exec "${CMD[@]}"
