"""The embedded SGLang engine (GPU): `rollout.engine=sglang`.

Each rank (one DP replica per GPU: parallel.tp = parallel.pp = 1) owns an `sglang.Engine` whose scheduler
runs in a child process on the same GPU. The engine starts from the actor's own weights (written once as
an HF directory through the converter's weight table) and receives them again after every update with
`update_weights_from_tensor` (CUDA tensors, no copy to disk). Between rollouts its weights and KV cache are
released (SGLang's memory saver), so training gets the memory back.

What differs from the native engine, by design of SGLang:
- its CUDA kernels (triton attention, CUDA graphs) give log-probs that differ slightly from the trainer's;
  `actor.rollout_correction` corrects for it and `rollout/mismatch_*` measures it;
- `SamplingParams.seed` is not honoured per request (the engine has one random_seed per rank);
- stop strings are applied after generation (the engine runs without a tokenizer): a response is cut right
  after the first stop string, with finish reason "stop".
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from typing import Iterable, Iterator, Optional

import torch

from rlhf_mcore.rollout.base import ROLLOUT_ENGINES
from rlhf_mcore.rollout.native import unwrap_model
from rlhf_mcore.rollout.responses import Response, assemble_batch
from rlhf_mcore.rollout.stopping import Decode, ends_with_stop_string
from rlhf_mcore.rollout.types import RolloutBatch, SamplingParams

log = logging.getLogger(__name__)


def check_supported(ctx) -> None:
    if not torch.cuda.is_available():
        raise ValueError("rollout.engine: sglang needs a CUDA GPU (got sglang on a machine without CUDA). "
                         "Use rollout.engine=native.")
    try:
        import sglang  # noqa: F401
    except ImportError as e:
        raise ValueError(f"rollout.engine: sglang is not importable ({e}). Install the gpu extra "
                         "(pip install 'rlhf-mcore[gpu]') or use rollout.engine=native.") from None
    errors = SGLangRolloutEngine.layout_errors(ctx.dims)
    if errors:
        raise ValueError(errors[0])


def actor_hf_state(actor, hf_cfg: dict) -> dict[str, torch.Tensor]:
    """The actor's current weights under HF names (the converter's weight table), on the actor's device."""
    from rlhf_mcore.convert.mcore import full_state_dict
    from rlhf_mcore.models.weights import mcore_to_hf

    with torch.no_grad():
        return mcore_to_hf(full_state_dict(actor), hf_cfg, role="actor")


def write_hf_dir(state: dict[str, torch.Tensor], hf_cfg: dict, dtype: torch.dtype) -> str:
    """A throw-away HF directory (config.json + model.safetensors) the engine loads at start-up."""
    from safetensors.torch import save_file

    path = tempfile.mkdtemp(prefix="rlhf_mcore_sglang_")
    config = {k: v for k, v in hf_cfg.items() if k != "torch_dtype"}
    config["torch_dtype"] = "bfloat16" if dtype == torch.bfloat16 else "float32"
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    save_file({k: v.detach().to("cpu", dtype).contiguous() for k, v in state.items()},
              os.path.join(path, "model.safetensors"))
    return path


def cut_at_stop_string(response: Response, stop_strings, decode: Optional[Decode]) -> Response:
    """Truncate right after the first token that completes a stop string."""
    if not stop_strings or decode is None:
        return response
    for i in range(len(response.tokens)):
        if ends_with_stop_string(response.tokens[:i + 1], stop_strings, decode):
            return Response(response.tokens[:i + 1], response.logprobs[:i + 1], "stop")
    return response


def sglang_sampling(params: SamplingParams) -> dict:
    """Our stop tokens only: without any, the model's own EOS must not end a response either (ignore_eos).

    >>> sglang_sampling(SamplingParams(max_new_tokens=4))["ignore_eos"]
    True
    """
    return {"max_new_tokens": params.max_new_tokens, "temperature": params.temperature, "top_p": params.top_p,
            "top_k": params.top_k, "stop_token_ids": list(params.stop_token_ids),
            "ignore_eos": not params.stop_token_ids}


def per_rank_rows(cfg, dp: int) -> int:
    """Sequences one rank decodes at once: its share of the step's prompts x n (or rollout.micro_batch_size).

    >>> from types import SimpleNamespace as N
    >>> per_rank_rows(N(data=N(train_batch_size=64), rollout=N(n=8, micro_batch_size=0)), dp=2)
    256
    """
    rows = -(-cfg.data.train_batch_size // dp) * cfg.rollout.n
    return min(rows, cfg.rollout.micro_batch_size) if cfg.rollout.micro_batch_size else rows


def engine_kwargs(cfg, dtype: torch.dtype, dp_rank: int, dp: int, gpu: int) -> dict:
    """sglang.Engine arguments: decode CUDA graphs up to the per-rank rollout batch (sglang 0.5.17 stops
    at 256 by default and decodes larger batches eagerly, 2.8x slower at 512), the configured attention
    backend, memory saver for release/resume between rollouts, one seed per rank, no tokenizer."""
    r = cfg.rollout
    return dict(skip_tokenizer_init=True, dtype="bfloat16" if dtype == torch.bfloat16 else "float32",
                attention_backend=r.attention_backend, enable_memory_saver=True,
                mem_fraction_static=r.gpu_memory_utilization, base_gpu_id=gpu,
                cuda_graph_max_bs_decode=r.cuda_graph_max_bs or per_rank_rows(cfg, dp),
                random_seed=cfg.trainer.seed + dp_rank, log_level="error", enable_fp32_lm_head=r.fp32_lm_head)


def set_compile_cache(directory: str) -> None:
    """Point the JIT caches SGLang uses (tvm-ffi / nvcc kernels, Triton, flashinfer) at `directory`, so a
    later run on the same machine or a persisted directory skips the compile. Variables already set win."""
    if not directory:
        return
    for var, sub in (("TVM_FFI_CACHE_DIR", "tvm-ffi"), ("TRITON_CACHE_DIR", "triton"),
                     ("FLASHINFER_WORKSPACE_BASE", "flashinfer")):
        os.environ.setdefault(var, os.path.join(directory, sub))


def weight_buckets(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
                   ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive groups of (name, tensor) of at most bucket_bytes each (a larger tensor goes alone),
    drawn lazily from `named`.

    >>> [[n for n, _ in b] for b in weight_buckets([("a", torch.zeros(4)), ("b", torch.zeros(4)),
    ...                                              ("c", torch.zeros(9))], 32)]
    [['a', 'b'], ['c']]
    """
    bucket, size = [], 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def to_response(out: dict) -> Response:
    meta = out["meta_info"]
    reason = (meta.get("finish_reason") or {}).get("type", "length")
    return Response(list(out["output_ids"]), [float(lp[0]) for lp in meta["output_token_logprobs"]],
                    "stop" if reason == "stop" else "length")


@ROLLOUT_ENGINES.register("sglang")
class SGLangRolloutEngine:
    def __init__(self, model, ctx, pad_id: int, decode: Optional[Decode] = None, cfg=None):
        check_supported(ctx)
        import sglang

        from rlhf_mcore.models.transformer_config import load_hf_config

        self.ctx, self.pad_id, self.decode = ctx, pad_id, decode
        self.hf_cfg = load_hf_config(cfg.model)
        self.bucket_bytes = cfg.rollout.weight_bucket_mb * 2**20
        actor = unwrap_model(model)
        dtype = actor.config.params_dtype
        start = time.perf_counter()
        self.model_dir = write_hf_dir(actor_hf_state(actor, self.hf_cfg), self.hf_cfg, dtype)
        set_compile_cache(cfg.rollout.compile_cache_dir)
        kwargs = engine_kwargs(cfg, dtype, ctx.dp_rank, ctx.dims.dp, torch.cuda.current_device())
        self.engine = sglang.Engine(model_path=self.model_dir, **kwargs)
        self.startup_s = time.perf_counter() - start
        log.info("rollout engine: embedded SGLang %s on GPU %d (%s attention, decode CUDA graphs up to batch %d, "
                 "memory saver) started in %.1f s (JIT compile + graph capture; rollout.compile_cache_dir=%r)",
                 sglang.__version__, torch.cuda.current_device(), kwargs["attention_backend"],
                 kwargs["cuda_graph_max_bs_decode"], self.startup_s, cfg.rollout.compile_cache_dir)

    def generate(self, prompts: list[list[int]], params: SamplingParams, show_progress: bool = False) -> RolloutBatch:
        rows = [p for p in prompts for _ in range(params.n)]
        if not rows:
            return assemble_batch([], [], self.pad_id, self.ctx.device)
        outs = self.engine.generate(input_ids=rows, sampling_params=sglang_sampling(params), return_logprob=True)
        responses = [cut_at_stop_string(to_response(o), params.stop_strings, self.decode) for o in outs]
        return assemble_batch(rows, responses, self.pad_id, self.ctx.device)

    def update_weights(self, actor_model) -> None:
        """The actor's weights (CUDA tensors handed over by IPC, no host copy), converted to HF names and
        sent in buckets of rollout.weight_bucket_mb as they are made (at most two buckets of converted
        copies exist at once); the prefix cache is flushed once, with the last bucket."""
        from rlhf_mcore.convert.mcore import full_state_dict
        from rlhf_mcore.models.weights import iter_mcore_to_hf

        with torch.no_grad():
            named = iter_mcore_to_hf(full_state_dict(unwrap_model(actor_model)), self.hf_cfg, role="actor")
            pending = None
            for bucket in weight_buckets(named, self.bucket_bytes):
                if pending is not None:
                    self._send(pending, flush_cache=False)
                pending = bucket
            if pending is not None:
                self._send(pending, flush_cache=True)

    def _send(self, bucket: list, flush_cache: bool) -> None:
        ok, message = self.engine.update_weights_from_tensor(bucket, flush_cache=flush_cache)
        if not ok:
            raise RuntimeError(f"sglang update_weights_from_tensor failed: {message}")

    def release_memory(self) -> None:
        self.engine.release_memory_occupation()

    def resume_memory(self) -> None:
        self.engine.resume_memory_occupation()

    def shutdown(self) -> None:
        self.engine.shutdown()

    @staticmethod
    def layout_errors(parallel) -> list[str]:
        """`parallel`: the config section or the run's ParallelDims (both have tp and pp)."""
        if parallel.tp > 1 or parallel.pp > 1:
            return [f"rollout.engine: sglang runs one engine per GPU and needs parallel.tp=1 and parallel.pp=1 "
                    f"(got tp={parallel.tp}, pp={parallel.pp}). Use rollout.engine=native for TP/PP layouts."]
        return []
