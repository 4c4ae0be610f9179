"""The embedded SGLang engine (GPU): `rollout.engine=sglang`, options in `rollout.sglang.*`.

Every GPU owns an `sglang.Engine` holding the whole model (inference TP = 1), its scheduler in a child
process on the same GPU, at any training layout (TP x PP x DP):

- rollout: a DP replica's rows (its prompts x n) are split over all its TP x PP ranks, each engine
  generates its share, and every rank of the replica gets all the replica's rows back in order
  (`rollout.replicas`); so every GPU rolls out;
- weights: the engine starts from the actor's own weights (gathered over TP, broadcast over PP by
  `models.full_weights`, written once as an HF directory) and receives them again after every update with
  `update_weights_from_tensor` (CUDA tensors, no copy to disk), converted and sent in buckets of
  rollout.sglang.weight_bucket_mb as they are gathered, each bucket one flat tensor (`sglang_weights`);
- prompts: a prompt's n samples are n requests (SGLang's own `n` is slow for large batches); the distinct
  prompts are prefilled once into SGLang's prefix cache first, so each sample computes only its last token;
- memory: between rollouts its weights and KV cache are released (SGLang's memory saver), so training
  gets the memory back.

What differs from the native engine, by design of SGLang:
- its CUDA kernels (triton attention, CUDA graphs) give log-probs that differ slightly from the trainer's;
  `actor.rollout_correction` corrects for it and `rollout/mismatch_*` measures it;
- `SamplingParams.seed` is not honoured per request (the engine has one random_seed per rank);
- stop strings are applied after generation (the engine runs without a tokenizer): a response is cut right
  after the first stop string, with finish reason "stop".

A vision LM (Qwen2.5-VL): each row's images go with it as SGLang's preprocessed form and its ids stay ours; the
tower starts from the actor's and is refreshed with it when trained (`sglang_images`).

Routing replay R3 (`record_routing`, actor.router_replay=R3): the engine starts with SGLang's
enable_return_routed_experts, every request asks for its routed experts, and each row's come back in the native
recorder's layout, cut to this rank's MoE layers (`sglang_routing`), into `RolloutBatch.routed_experts`.
"""
from __future__ import annotations

import atexit
import dataclasses
import functools
import inspect
import itertools
import json
import logging
import os
import sys
import tempfile
import time
from typing import Callable, Iterable, Optional

import torch

from rlhf_mcore.models.full_weights import FullWeights, hf_weights, unwrap_model
from rlhf_mcore.models.hf_io import export_tensors
from rlhf_mcore.models.registry import spec_for_hf_config
from rlhf_mcore.models.vision import vision_side
from rlhf_mcore.rollout import sglang_continuous, sglang_images
from rlhf_mcore.rollout.base import ROLLOUT_ENGINES, EngineSetup
from rlhf_mcore.rollout.replicas import generate_shared
from rlhf_mcore.rollout.responses import Response, assemble_batch
from rlhf_mcore.rollout.sglang_routing import SGLangRouting
from rlhf_mcore.rollout.sglang_weights import FLATTENED, flatten_bucket, sglang_payload, weight_buckets
from rlhf_mcore.rollout.stopping import Decode, ends_with_stop_string
from rlhf_mcore.rollout.types import RolloutBatch, SamplingParams
from rlhf_mcore.rollout.vision_decode import attach_images, row_images

log = logging.getLogger(__name__)


GiB = 2**30


def check_supported() -> None:
    if not torch.cuda.is_available():
        raise ValueError("rollout.engine: sglang needs a CUDA GPU (got sglang on a machine without CUDA). "
                         "Use rollout.engine=native.")
    try:
        import sglang  # noqa: F401
    except ImportError as e:
        raise ValueError(f"rollout.engine: sglang is not importable ({e}). Install the gpu extra "
                         "(pip install 'rlhf-mcore[gpu]') or use rollout.engine=native.") from None


def fit_errors(utilization: float, num_params: int, bytes_per_param: int, device_bytes: int,
               kv_bytes: int) -> list[str]:
    """An error when one GPU cannot hold the whole model plus the KV cache of one full sequence within
    `utilization` of its memory (every GPU keeps its own copy: inference TP = 1).

    >>> fit_errors(0.5, 7 * 10**9, 2, 80 * GiB, GiB)
    []
    >>> print(fit_errors(0.5, 40 * 10**9, 2, 80 * GiB, GiB)[0])  # doctest: +NORMALIZE_WHITESPACE
    rollout.engine: sglang keeps the whole model on every GPU and needs 75.5 GiB (74.5 GiB of weights for
    40.00B parameters + 1.0 GiB KV cache of one sequence), more than rollout.sglang.gpu_memory_utilization=0.5
    of this 80 GiB GPU (got sglang). Raise rollout.sglang.gpu_memory_utilization to at least 0.95, or use
    rollout.engine=native (it decodes with the TP/PP-sharded actor).
    """
    need = num_params * bytes_per_param + kv_bytes
    if need <= utilization * device_bytes:
        return []
    least = need / device_bytes
    fix = (f"Raise rollout.sglang.gpu_memory_utilization to at least {-(-least * 100 // 1) / 100:.2f}, or use"
           if least <= 0.95 else "The model does not fit one GPU for inference: use")
    return [f"rollout.engine: sglang keeps the whole model on every GPU and needs {need / GiB:.1f} GiB "
            f"({num_params * bytes_per_param / GiB:.1f} GiB of weights for {num_params / 1e9:.2f}B parameters + "
            f"{kv_bytes / GiB:.1f} GiB KV cache of one sequence), more than rollout.sglang.gpu_memory_utilization="
            f"{utilization:g} of this {device_bytes / GiB:.3g} GiB GPU (got sglang). {fix} rollout.engine=native "
            "(it decodes with the TP/PP-sharded actor)."]


def write_hf_dir(named: Iterable[tuple[str, torch.Tensor]], hf_cfg: dict, dtype: torch.dtype) -> str:
    """A throw-away HF directory (config.json + model.safetensors) the engine loads at start-up, under the names
    transformers reads too (`hf_io.export_tensors`); the tensors are copied to the host one at a time as `named`
    yields them. config.json names the family's architecture where the user's has none (a config transformers
    resolves by model_type alone): SGLang picks its model class by `architectures[0]`."""
    from safetensors.torch import save_file

    path = tempfile.mkdtemp(prefix="rlhf_mcore_sglang_")
    config = {k: v for k, v in sglang_images.engine_config(hf_cfg).items() if k != "torch_dtype"}
    config["torch_dtype"] = "bfloat16" if dtype == torch.bfloat16 else "float32"
    config["architectures"] = config.get("architectures") or [spec_for_hf_config(hf_cfg).architectures[0]]
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in named}
    save_file(export_tensors(tensors, hf_cfg), os.path.join(path, "model.safetensors"))  # nested names, fused experts
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
    """The run's stop set (`rlhf_mcore.stop_tokens`): SGLang stops at these ids and at its model's own eos
    (config.json's, which the set holds), so both engines end responses at the same tokens. Without stop ids
    the model's eos must not end a response either (ignore_eos).

    >>> sglang_sampling(SamplingParams(max_new_tokens=4))["ignore_eos"]
    True
    """
    return {"max_new_tokens": params.max_new_tokens, "temperature": params.temperature, "top_p": params.top_p,
            "top_k": params.top_k, "stop_token_ids": list(params.stop_token_ids),
            "ignore_eos": not params.stop_token_ids}


def resource_tracker_pid() -> Optional[int]:
    """The pid of this process's multiprocessing resource tracker (None while none runs)."""
    from multiprocessing import resource_tracker

    return getattr(resource_tracker._resource_tracker, "_pid", None)  # noqa: SLF001 - no public accessor


def shutdown_server(server) -> None:
    """`server.shutdown()` that spares this process's multiprocessing resource tracker.

    sglang.Engine.shutdown kills every child process of this one (`kill_process_tree(os.getpid(),
    include_parent=False)`), the resource tracker included. The next release of a named semaphore or shared
    memory block (at exit: loky's, torch's) then relaunches a tracker that never saw that name, and it prints
    "resource_tracker: process died unexpectedly" and a KeyError traceback. So the tree kill skips the tracker
    (SGLang's `skip_pid`), and the engine's own atexit shutdown, a second tree kill at exit, is unregistered.
    """
    module = sys.modules.get(type(server).__module__)
    kill, tracker = getattr(module, "kill_process_tree", None), resource_tracker_pid()
    spare = callable(kill) and tracker is not None and "skip_pid" in inspect.signature(kill).parameters
    if spare:
        module.kill_process_tree = functools.partial(kill, skip_pid=tracker)
    try:
        server.shutdown()
    finally:
        if spare:
            module.kill_process_tree = kill
        atexit.unregister(server.shutdown)


def per_gpu_rows(replica_rows: int, gpus_per_replica: int, micro_batch_size: int) -> int:
    """Sequences one GPU decodes at once: its share of its replica's rows (or rollout.micro_batch_size).

    >>> per_gpu_rows(replica_rows=256, gpus_per_replica=2, micro_batch_size=0)
    128
    """
    rows = -(-replica_rows // gpus_per_replica)
    return min(rows, micro_batch_size) if micro_batch_size else rows


def engine_kwargs(options, setup: EngineSetup, dtype: torch.dtype, gpu: int) -> dict:
    """sglang.Engine arguments: decode CUDA graphs up to the per-GPU rollout batch (sglang 0.5.17 stops
    at 256 by default and decodes larger batches eagerly, 2.8x slower at 512), the configured attention
    backend, memory saver for release/resume between rollouts, one seed per rank, no tokenizer; R3: the routed
    experts of every forward kept for the requests (`sglang_routing`)."""
    ctx = setup.ctx
    rows = per_gpu_rows(setup.replica_rows, ctx.dims.tp * ctx.dims.pp, setup.micro_batch_size)
    routing = {"enable_return_routed_experts": True} if setup.record_routing else {}
    return dict(skip_tokenizer_init=True, dtype="bfloat16" if dtype == torch.bfloat16 else "float32",
                attention_backend=options.attention_backend, enable_memory_saver=True,
                mem_fraction_static=options.gpu_memory_utilization, base_gpu_id=gpu,
                cuda_graph_max_bs_decode=options.cuda_graph_max_bs or rows,
                random_seed=setup.seed + ctx.rank, log_level="error",
                enable_fp32_lm_head=options.fp32_lm_head, **routing)


def set_compile_cache(directory: str) -> None:
    """Point the JIT caches SGLang uses (tvm-ffi / nvcc kernels, Triton, flashinfer) at `directory`, so a
    later run on the same machine or a persisted directory skips the compile. Variables already set win."""
    if not directory:
        return
    for var, sub in (("TVM_FFI_CACHE_DIR", "tvm-ffi"), ("TRITON_CACHE_DIR", "triton"),
                     ("FLASHINFER_WORKSPACE_BASE", "flashinfer")):
        os.environ.setdefault(var, os.path.join(directory, sub))


def to_response(out: dict) -> Response:
    """A request's result. An aborted one (partial rollouts) keeps what it decoded so far, read from its log-prob
    pairs (token, log-prob), which SGLang keeps whole where a non-streamed abort's output_ids may lag.

    >>> to_response({"output_ids": [7], "meta_info": {"finish_reason": {"type": "abort"},
    ...              "output_token_logprobs": [(-0.5, 7, None), (-0.25, 9, None)]}})
    Response(tokens=[7, 9], logprobs=[-0.5, -0.25], finish_reason='abort')
    """
    meta = out["meta_info"]
    reason = (meta.get("finish_reason") or {}).get("type", "length")
    pairs = meta.get("output_token_logprobs") or []
    tokens = [int(p[1]) for p in pairs] if reason == "abort" else list(out["output_ids"])
    return Response(tokens, [float(p[0]) for p in pairs][:len(tokens)],
                    reason if reason in ("stop", "abort") else "length")


@ROLLOUT_ENGINES.register("sglang", section="sglang", requires=("sglang",), needs_cuda=True,
                           records_routing=True)
class SGLangRolloutEngine:
    """One embedded engine per GPU (any training layout); see the module doc and `rollout.base`."""

    def __init__(self, setup: EngineSetup, bucket_bytes: int, server, weights: Optional[FullWeights] = None,
                 encode: Optional[Callable] = None):
        """`server`: the engine behind the thin calls below (an `sglang.Engine` on a GPU; a stand-in in tests).
        `weights`: the actor's full weights at this layout (built here, collectively, when not given).
        `encode(flat, entries)`: a flat weight bucket as the server takes it (`sglang_weights.sglang_payload`);
        None sends each bucket's tensors one by one. `prefill_prompts_once`: see `_prefill_shared_prompts`."""
        self.ctx, self.pad_id, self.decode = setup.ctx, setup.pad_id, setup.decode
        self.hf_cfg, self.bucket_bytes, self.engine = setup.hf_config, bucket_bytes, server
        self.weights = weights or FullWeights(setup.model, setup.ctx)
        self.encode, self.prefill_prompts_once, self.stopped = encode, True, False
        self.routing = SGLangRouting.for_model(unwrap_model(setup.model), setup.hf_config) \
            if setup.record_routing else None  # R3
        self.vision = vision_side(unwrap_model(setup.model))  # None for a text model

    @classmethod
    def build(cls, options, setup: EngineSetup) -> "SGLangRolloutEngine":
        check_supported()
        import sglang

        dtype = unwrap_model(setup.model).config.params_dtype
        start = time.perf_counter()
        weights = FullWeights(setup.model, setup.ctx)
        model = unwrap_model(setup.model)
        named = itertools.chain(hf_weights(weights, setup.hf_config), sglang_images.tower_tensors(model))
        model_dir = write_hf_dir(named, setup.hf_config, dtype)
        if vision_side(model) is not None:
            sglang_images.copy_processor_files(setup.hf_dir, model_dir)
            os.environ.update(sglang_images.vlm_cache_env(model))  # read when the scheduler starts
        set_compile_cache(options.compile_cache_dir)
        kwargs = engine_kwargs(options, setup, dtype, torch.cuda.current_device())
        if vision_side(model) is not None:
            kwargs |= sglang_images.vision_engine_kwargs()
        server = sglang.Engine(model_path=model_dir, **kwargs)
        engine = cls(setup, options.weight_bucket_mb * 2**20, server, weights, encode=sglang_payload)
        log.info("rollout engine: embedded SGLang %s on GPU %d (%s attention, decode CUDA graphs up to batch %d, "
                 "memory saver, weight refresh in flat buckets of %d MiB) started in %.1f s (JIT compile + graph "
                 "capture; rollout.sglang.compile_cache_dir=%r)",
                 sglang.__version__, torch.cuda.current_device(), kwargs["attention_backend"],
                 kwargs["cuda_graph_max_bs_decode"], options.weight_bucket_mb, time.perf_counter() - start,
                 options.compile_cache_dir)
        return engine

    def generate(self, prompts: list[list[int]], params: SamplingParams, show_progress: bool = False,
                 images: list | None = None, prompt_lengths: list[int] | None = None) -> RolloutBatch:
        """`images` (a vision LM's prompts): per prompt (pixel_values [p, D], image_grid_thw [i, 3]) or None.
        `prompt_lengths`: per prompt, how many of its ids are the prompt (a continued sample); SGLang reads every
        image id as an image, so one after the prompt is refused (`sglang_images.check_continued`)."""
        if prompt_lengths is not None and self.vision is not None:
            sglang_images.check_continued(prompts, prompt_lengths, self.vision)
        rows = [p for p in prompts for _ in range(params.n)]
        if not rows:
            return assemble_batch([], [], self.pad_id, self.ctx.device)
        sampling = sglang_sampling(params)
        routed = {"return_routed_experts": True} if self.routing is not None else {}
        row_pictures = row_images(images, params.n, len(prompts))
        per_row = sglang_images.image_data(row_pictures)

        def generate_rows(mine: list[tuple]) -> list[Response]:
            ids = [r for r, _ in mine]
            pictures = {"image_data": [im for _, im in mine]} if per_row is not None else {}
            if not pictures:  # with images the n samples share the prompt's prefix by its image hash instead
                self._prefill_shared_prompts(ids)
            outs = self.engine.generate(input_ids=ids, sampling_params=sampling, return_logprob=True, **routed,
                                        **pictures)
            responses = [cut_at_stop_string(to_response(o), params.stop_strings, self.decode) for o in outs]
            if self.routing is not None:  # R3: every layer's, so any rank of the replica can take its own
                for prompt, out, r in zip(ids, outs, responses):
                    r.routing = self.routing.row(out, len(prompt), len(r.tokens))
            return responses

        pairs = list(zip(rows, per_row or [None] * len(rows)))
        responses = generate_shared(pairs, generate_rows, self.ctx.pgs.mp)  # every GPU of the replica
        if self.routing is not None:
            for r in responses:
                r.routing = self.routing.this_rank(r.routing)
        batch = assemble_batch(rows, responses, self.pad_id, self.ctx.device)
        return attach_images(batch, images, row_pictures, self.ctx.device)

    @property
    def continuous(self) -> bool:
        """Whether `generate_continuous` runs: a DP replica of one GPU (its engine alone decides when to stop), a
        text model (a vision LM's rows carry images, which `generate` takes: partial rollouts run in rounds), and no
        R3 recording (`generate` returns each row's experts; the continuous call does not)."""
        return self.ctx.dims.tp * self.ctx.dims.pp == 1 and self.vision is None and self.routing is None

    def generate_continuous(self, rows: list[list[int]], limits: list[int], params: SamplingParams,
                            on_finish, num_slots: int, feed=None) -> dict[int, Response]:
        """Continuous batching by abort and continue (`rlhf_mcore.rollout.sglang_continuous`): rows[i] may add
        limits[i] tokens; each ended row goes to on_finish(i, Response) at once, and when that returns True the
        requests in flight are aborted and returned, cut (finish_reason "abort"). `feed`: rows joining the call."""
        if not self.continuous:
            raise RuntimeError("sglang rollout: continuous batching needs a replica of one GPU (tp = pp = 1); "
                               "use generate() in rounds instead.")

        def sampling(limit: int) -> dict:
            return sglang_sampling(dataclasses.replace(params, max_new_tokens=limit))

        def response(out: dict) -> Response:
            return cut_at_stop_string(to_response(out), params.stop_strings, self.decode)

        return sglang_continuous.decode(self.engine, rows, limits, sampling, response, on_finish, num_slots, feed)

    def _prefill_shared_prompts(self, rows: list[list[int]]) -> None:
        """A prompt that several rows share (its n samples) is prefilled once, into SGLang's prefix cache,
        before the rows are sent: each row then computes only its last prompt token. Sent at once, the rows
        would each prefill the whole prompt (above 128 waiting requests SGLang's scheduler stops matching
        prefixes within a batch), and SGLang's own `n` waits for each prompt's prefill in turn."""
        unique = list(dict.fromkeys(map(tuple, rows)))
        if self.prefill_prompts_once and len(unique) < len(rows):
            self.engine.generate(input_ids=[list(p) for p in unique], sampling_params={"max_new_tokens": 0},
                                 return_logprob=False)

    def update_weights(self, actor_model) -> dict[str, float]:
        """The actor's full weights on every GPU (TP gather, PP broadcast), converted to HF names and sent
        in buckets of rollout.sglang.weight_bucket_mb as they are made, each flattened into one tensor
        (`sglang_weights`); each bucket is dropped once sent (the extra memory is one bucket, its flat copy
        and the tensor being converted); the prefix cache is flushed once at the end. Returns the bytes
        handed to the engine and received over TP/PP on this rank, in GB."""
        if unwrap_model(actor_model) is not self.weights.model:
            self.weights = FullWeights(actor_model, self.ctx)
        received, sent = self.weights.bytes_received, 0
        with torch.no_grad():
            model = unwrap_model(actor_model)
            # the tower too, frozen or not: release_memory drops every weight of the engine, and SGLang has no host
            # copy (H200, Qwen3-VL: a frozen tower left out ran on garbage, mismatch 1.40 from the first token)
            named = itertools.chain(hf_weights(self.weights, self.hf_cfg), sglang_images.tower_tensors(model))
            for bucket in weight_buckets(named, self.bucket_bytes):
                self._send(bucket)
                sent += sum(t.numel() * t.element_size() for _, t in bucket)
                bucket.clear()
        self.engine.flush_cache()
        return {"perf/weight_sync_gb": sent / 1e9,
                "perf/weight_reshard_gb": (self.weights.bytes_received - received) / 1e9}

    def _send(self, bucket: list) -> None:
        if self.encode is None:
            ok, message = self.engine.update_weights_from_tensor(bucket, flush_cache=False)
        else:  # one flat tensor: one CUDA IPC handle per bucket instead of one per tensor (sglang_weights)
            ok, message = self.engine.update_weights_from_tensor(self.encode(*flatten_bucket(bucket)),
                                                                 load_format=FLATTENED, flush_cache=False)
        if not ok:
            raise RuntimeError(f"sglang update_weights_from_tensor failed: {message}")

    def release_memory(self) -> None:
        self.engine.release_memory_occupation()

    def resume_memory(self) -> None:
        """The engine's memory back, after the trainer's free cached blocks go back to the device: the scheduler is
        another process and cannot reuse them (on the H200, the update's ~30 GiB of cache stayed reserved through
        the rollout, beside the engine's whole memory fraction)."""
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.engine.resume_memory_occupation()

    def shutdown(self) -> None:
        """Stop the engine's processes (once; later calls do nothing), without tracebacks at exit."""
        if not self.stopped:
            self.stopped = True
            shutdown_server(self.engine)

    @staticmethod
    def layout_errors(parallel) -> list[str]:
        """Every TP / PP / DP layout: each GPU holds the whole model for inference (see memory_errors)."""
        return []

    @staticmethod
    def memory_errors(options, num_params: int, bytes_per_param: int, device_bytes: int,
                      kv_bytes: int) -> list[str]:
        return fit_errors(options.gpu_memory_utilization, num_params, bytes_per_param, device_bytes, kv_bytes)
