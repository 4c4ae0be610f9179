"""The native rollout engine: batched KV-cache decoding with the actor's own megatron modules.

Its weights ARE the actor's (same module objects), so there is nothing to copy or sync. Per micro-batch of
rows (prompt x sample): left-pad the prompts, prefill them in one forward (causal AND not-padding mask),
then decode one token per step for the whole batch until every row has finished.

- KV cache: megatron's `StaticInferenceContext` (`rlhf_mcore.rollout.kv_cache`); the engine advances its
  `sequence_len_offset`. When at most half of the cached rows are still running, the running rows are
  moved to the front of the cache and the finished ones are no longer decoded.
- TP: local logits = hidden @ W_local.T, all-gathered over the vocab shards, padded ids masked; every TP
  rank draws the same tokens from identical logits with a generator seeded by (seed, DP rank) only.
- PP: each forward runs the stages in turn (hidden [s, b, h] sent stage to stage); the last stage samples
  and broadcasts tokens, log-probs and finished flags, so every rank of a replica returns the same batch.
  Micro-batches are not interleaved across stages (one stage computes at a time).
- CUDA graphs (`rollout.native.cuda_graphs`, on by default): at tp = pp = 1 on a GPU the engine decodes with
  `static_decode.StaticDecoder` instead (static KV cache, one captured graph per batch-size bucket,
  sampling and log-probs inside the graph, no host sync per step unless stop tokens / strings can end
  rows; each row's prompt and response at the trainer's columns, so its log-probs are the trainer's).
  Elsewhere it keeps this eager path and logs why once.
- EP (MoE experts split over ranks): every MoE forward exchanges tokens over the expert-parallel group, so its
  ranks decode in lockstep: a rank runs as many micro-batches and decode steps as the busiest rank of its group
  (an extra micro-batch is one padding row, discarded, that counts as ended; a rank whose rows have all ended
  keeps stepping them). `lockstep_group` names that group, so callers with a per-rank number of calls
  (multi-turn) agree on each call and its max_new_tokens; `generate([])` then runs padding forwards only.
- Continuous batching (`generate_continuous`, partial rollouts): with the static decoder, a finished row's cache
  slot takes the next queued row mid-decode (`rlhf_mcore.rollout.continuous`).
- Routing replay R3 (`record_routing`, from actor.router_replay=R3): the eager path records each row's top-k
  experts per MoE layer of this stage, prompt and response (`rollout.routing_record`), into
  `RolloutBatch.routed_experts`; the static decoder does not record, so R3 decodes eagerly.
- Not supported: sequence parallelism (a 1-token decode step cannot be split over TP ranks) and virtual
  pipeline chunks; the constructor says so.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Optional

import torch
import torch.distributed as dist

from rlhf_mcore.logs import progress
from rlhf_mcore.models.full_weights import unwrap_model
from rlhf_mcore.models.vision import vision_side
from rlhf_mcore.rollout import comm, continuous, kv_cache, vision_decode
from rlhf_mcore.rollout.base import ROLLOUT_ENGINES
from rlhf_mcore.rollout.responses import Response, ResponseBuffer, assemble_batch
from rlhf_mcore.rollout.routing_record import RolloutRouting
from rlhf_mcore.rollout.sampling import replica_seed, sample
from rlhf_mcore.rollout.static_decode import StaticDecoder, bucket_for, graph_blockers
from rlhf_mcore.rollout.stopping import Decode, is_stop_token, stop_string_hits, tail_window
from rlhf_mcore.rollout.types import RolloutBatch, SamplingParams

log = logging.getLogger(__name__)


@contextlib.contextmanager
def inference_mode(model):
    """no_grad + eval() (megatron uses the inference context only in eval), train mode restored after."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def check_request(prompts: list[list[int]], params: SamplingParams) -> None:
    if params.n < 1 or params.max_new_tokens < 1:
        raise ValueError(f"SamplingParams: n and max_new_tokens must be >= 1 (got n={params.n}, "
                         f"max_new_tokens={params.max_new_tokens}). Set rollout.n / max_response_length >= 1.")
    empty = [i for i, p in enumerate(prompts) if len(p) == 0]
    if empty:
        raise ValueError(f"rollout prompts: prompt(s) {empty[:5]} have no tokens. Filter empty prompts out.")


@ROLLOUT_ENGINES.register("native", section="native", records_routing=True)
class NativeRolloutEngine:
    """generate() with the actor's megatron modules; see `rlhf_mcore.rollout.base` for the contract."""

    def __init__(self, model, ctx, pad_id: int, decode: Optional[Decode] = None, micro_batch_size: int = 0,
                 cuda_graphs: bool = True, keep_graphs: bool = True, compile_decode: bool = True,
                 decode_attention: str = "auto", empty_cache: bool = True, static_on_cpu: bool = False,
                 record_routing: bool = False):
        self.model = unwrap_model(model)
        if getattr(self.model.config, "sequence_parallel", False):
            raise ValueError("parallel.sequence_parallel: the native rollout engine cannot decode with sequence "
                             "parallelism (got true). Set parallel.sequence_parallel=false or rollout.engine=sglang.")
        if micro_batch_size < 0:
            raise ValueError(f"rollout.micro_batch_size: must be >= 0 (got {micro_batch_size}). Use 0 for all rows.")
        self.ctx = ctx
        self.pad_id = pad_id
        self.decode = decode
        self.micro_batch_size = micro_batch_size  # rows decoded together; 0 = all of them
        self._kv = None  # StaticInferenceContext, kept between calls while it is large enough
        self._released = False
        self.keep_graphs = keep_graphs  # release_memory() keeps the static cache and graphs
        self.empty_cache = empty_cache  # release_memory() returns torch's cached blocks to the device
        self.routing = RolloutRouting.for_model(self.model) if record_routing else None  # R3: None on dense stages
        self.static = self._static_decoder(cuda_graphs, compile_decode, decode_attention, static_on_cpu)
        self.continuous_attention = self._continuous_attention(decode_attention)

    @classmethod
    def build(cls, options, setup) -> "NativeRolloutEngine":
        """From rollout.native (`options`) and the run's `EngineSetup`."""
        keep = options.keep_graphs and not setup.release_cache
        if options.keep_graphs and options.cuda_graphs and setup.release_cache:
            log.warning("native rollout: %s; the decoder's cache and graphs are freed after each rollout instead "
                        "(trainer.check_memory_plan=false keeps them)", setup.release_cache)
        return cls(setup.model, setup.ctx, setup.pad_id, setup.decode, micro_batch_size=setup.micro_batch_size,
                   cuda_graphs=options.cuda_graphs, keep_graphs=keep,
                   compile_decode=options.compile_decode, decode_attention=options.decode_attention,
                   empty_cache=options.empty_cache, static_on_cpu=options.static_on_cpu,
                   record_routing=setup.record_routing)

    def _static_decoder(self, cuda_graphs: bool, compile_decode: bool, attention: str,
                        on_cpu: bool = False) -> Optional[StaticDecoder]:
        if not cuda_graphs:
            log.info("native rollout: CUDA graphs off (rollout.native.cuda_graphs=false); decoding eagerly")
            return None
        if self.routing is not None:
            log.info("native rollout: decoding eagerly, which records the routing (actor.router_replay=R3)")
            return None
        blockers = graph_blockers(self.model, self.ctx)
        if self.ctx.device.type != "cuda" and not blockers and on_cpu:
            from rlhf_mcore.models.heads import lm_output_weight

            log.info("native rollout: static decoder on the CPU (rollout.native.static_on_cpu=true): eager steps, "
                     "sdpa attention, no graphs")
            return StaticDecoder(self.model, lambda: lm_output_weight(self.model), use_graphs=False)
        if self.ctx.device.type != "cuda":
            blockers.insert(0, "no CUDA device")
        if blockers:
            log.info("native rollout: CUDA graphs unavailable (%s); decoding eagerly", "; ".join(blockers))
            return None
        from rlhf_mcore.models.heads import lm_output_weight
        from rlhf_mcore.rollout.decode_layer import pick_decode_attention, sdpa_is_trainer_exact

        layer = self.model.decoder.layers[0].self_attention
        core = layer.core_attention
        attention, why = pick_decode_attention(attention, self.ctx.device, lambda: sdpa_is_trainer_exact(
            core, layer.num_attention_heads_per_partition, layer.num_query_groups_per_partition,
            layer.hidden_size_per_attention_head, self.model.config.params_dtype, self.ctx.device,
            core.softmax_scale))
        log.info("native rollout: CUDA-graphed decode (static KV cache, graphs per batch-size bucket%s, %s "
                 "attention: %s)", ", torch.compile'd step" if compile_decode else "", attention, why)
        static = StaticDecoder(self.model, lambda: lm_output_weight(self.model), use_graphs=True,
                               compile_backend="inductor" if compile_decode else None, attention=attention)
        if static.merged:
            log.info("native rollout: LoRA adapters merged into the decode step's weights once per rollout "
                     "(rollout.merged_weights; the prefill runs the adapters' own forward)")
        return static

    def _continuous_attention(self, option: str) -> Optional[str]:
        """The decode attention of continuous batching. Its rows sit at very different positions, and sdpa reads
        every row to the longest one's, so with decode_attention=auto it is the split-KV kernel, which reads each
        row to its own position, where that can run (its log-probs sum in their own order: partial rollouts
        recompute them at the trainer anyway)."""
        if self.static is None:
            return None
        from rlhf_mcore.rollout.decode_layer import pick_decode_attention

        name, why = pick_decode_attention("triton" if option == "auto" else option, self.ctx.device)
        if option == "auto" and self.static.attention_name != name:
            log.info("native rollout: continuous batching (partial rollouts) decodes with %s attention: %s", name, why)
        return name

    # ---- the RolloutEngine protocol ------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], params: SamplingParams, show_progress: bool = False,
                 images: list | None = None, prompt_lengths: list[int] | None = None) -> RolloutBatch:
        """`images` (a vision LM's prompts): per prompt (pixel_values [p, D], image_grid_thw [i, 3]) or None.
        `prompt_lengths` (a vision LM's continued samples): per prompt, how many of its leading ids are the prompt;
        an image id after that is text (`vision_decode.image_layout`). None: all of them."""
        if self._released:
            raise RuntimeError("native rollout: generate() after release_memory(); call resume_memory() first.")
        check_request(prompts, params)
        rows = [p for p in prompts for _ in range(params.n)]  # row i = sample i % n of prompt i // n
        size = self.micro_batch_size or max(len(rows), 1)
        chunks = [rows[i:i + size] for i in range(0, len(rows), size)]
        per_row = vision_decode.row_images(images, params.n, len(prompts))
        spans = vision_decode.row_spans(prompt_lengths, rows, params.n)
        generator = torch.Generator(device=self.ctx.device).manual_seed(replica_seed(params.seed, self.ctx.dp_rank))
        bar = progress(len(chunks) * params.max_new_tokens, "rollout", show_progress and self.ctx.rank == 0,
                       unit="decode steps")
        with inference_mode(self.model), bar:
            if self.static is not None:
                self.static.refresh_weights()  # LoRA: merge the current adapters once for this rollout
                with torch.random.fork_rng(devices=[self.ctx.device] if self.ctx.device.type == "cuda" else []):
                    torch.manual_seed(replica_seed(params.seed, self.ctx.dp_rank))
                    responses = [r for k, chunk in enumerate(chunks) for r in self._generate_static(
                        chunk, params, bar, per_row[k * size:k * size + len(chunk)],
                        spans[k * size:k * size + len(chunk)])]
            else:
                extra = self._group_max(len(chunks)) - len(chunks)  # EP lockstep: padding micro-batches, discarded
                responses = [r for k, chunk in enumerate(chunks) for r in self._generate_chunk(
                    chunk, params, generator, bar, images=per_row[k * size:k * size + len(chunk)],
                    spans=spans[k * size:k * size + len(chunk)])]
                for _ in range(extra):
                    self._generate_chunk([[self.pad_id]], params, generator, bar, padding=True)
        batch = assemble_batch(rows, responses, self.pad_id, self.ctx.device)
        return vision_decode.attach_images(batch, images, per_row, self.ctx.device)

    @property
    def continuous(self) -> bool:
        """Whether `generate_continuous` can run: with the static decoder, whose slots each have a position
        and a response column of their own (megatron's eager cache has one offset for all rows), and no expert
        group to keep in lockstep (its ranks would stop at different steps), and a text model (its rows are token
        prefixes; a vision LM's carry images, which `generate` takes). R3's recording decodes eagerly: no static
        decoder, so no continuous call either."""
        return self.static is not None and self.lockstep_group is None and vision_side(self.model) is None

    def generate_continuous(self, rows: list[list[int]], limits: list[int], params: SamplingParams,
                            on_finish, num_slots: int, feed=None) -> dict[int, Response]:
        """Continuous batching over `num_slots` cache slots (`rlhf_mcore.rollout.continuous`): rows[i] (a token
        prefix) may add limits[i] tokens; each ended row goes to on_finish(i, Response) at once, and the call
        stops when that returns True. The rows cut then, by index (finish_reason "abort"). Seeded like generate.
        `feed` (`continuous.Feed`): rows that join the call while it runs (multi-turn samples back from tools)."""
        if not self.continuous:
            raise RuntimeError("native rollout: continuous batching needs the static decoder (tp=pp=1 on a GPU, "
                               "rollout.native.cuda_graphs=true) and a text model; use generate() in rounds instead.")
        if self._released:
            raise RuntimeError("native rollout: generate_continuous() after release_memory(); call resume_memory().")
        check_request(rows, dataclasses.replace(params, max_new_tokens=min(limits, default=1)))
        device = self.ctx.device
        with inference_mode(self.model), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), \
                self.static.attention_for(self.continuous_attention):
            torch.manual_seed(replica_seed(params.seed, self.ctx.dp_rank))
            self.static.refresh_weights()
            stop_ids = self.static.stop_tensor(params.stop_token_ids, device)
            return continuous.decode(self.static, rows, limits, params, stop_ids, on_finish, num_slots, self.pad_id,
                                     device, self.decode, feed=feed)

    @property
    def lockstep_group(self):
        """The ranks whose generate() calls must meet, with the same max_new_tokens: the expert-parallel group at
        EP > 1 (its ranks exchange tokens in every MoE forward), None at EP 1."""
        return self.ctx.pgs.ep if getattr(self.ctx.dims, "ep", 1) > 1 else None

    def _group_max(self, n: int) -> int:
        """n's maximum over the expert-parallel group (EP > 1: its ranks exchange tokens in every MoE
        forward, so they run the same number of forwards); n itself at EP 1."""
        if getattr(self.ctx.dims, "ep", 1) <= 1:
            return n
        t = torch.tensor([n], dtype=torch.long, device=self.ctx.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.ctx.pgs.ep)
        return int(t.item())

    def update_weights(self, actor_model) -> None:
        """No-op: the engine decodes with the actor's own modules, so it always sees the current weights."""
        if unwrap_model(actor_model) is not self.model:
            raise ValueError("native rollout: update_weights() got a different model than the engine was built "
                             "with. The native engine shares the actor's modules; build it with that model.")

    def release_memory(self) -> None:
        """Drop the KV cache (the weights are the actor's and stay); the static cache and its graphs stay
        too when keep_graphs (re-capturing them costs more than the memory is worth at small scale). With
        empty_cache the freed blocks go back to the device; else torch keeps them cached for the trainer (it
        frees cached blocks itself before an allocation would fail)."""
        self._kv = None
        self._released = True
        if self.static is not None and not self.keep_graphs:
            self.static.release()
        if self.empty_cache and torch.cuda.is_available():
            torch.cuda.empty_cache()

    def resume_memory(self) -> None:
        """Allow generate() again; the KV cache is reallocated by the attention layers at the next prefill."""
        self._released = False

    def shutdown(self) -> None:
        """Nothing to stop: the engine runs in this process on the actor's modules."""

    @staticmethod
    def memory_errors(options, num_params: int, bytes_per_param: int, device_bytes: int,
                      kv_bytes: int) -> list[str]:
        """None: the engine keeps no copy of the model (it decodes with the actor's TP/PP shard)."""
        return []

    @staticmethod
    def layout_errors(parallel) -> list[str]:
        if parallel.sequence_parallel:
            return ["parallel.sequence_parallel: the native rollout engine cannot decode with it (got true). Set it "
                    "to false; tools/check_layouts.py --sequence-parallel checks training with it."]
        return []

    # ---- decoding ------------------------------------------------------------------------------------
    def _context(self, batch_size: int, sequence_length: int):
        if kv_cache.fits(self._kv, batch_size, sequence_length):
            self._kv.reset()
        else:
            self._kv = None  # free the old buffers before the new ones are allocated
            self._kv = kv_cache.new_context(batch_size, sequence_length)
        return self._kv

    def _generate_chunk(self, rows: list[list[int]], params: SamplingParams, generator, bar,
                        padding: bool = False, images: list | None = None,
                        spans: list[int] | None = None) -> list[Response]:
        """Prefill then decode `rows`; a padding chunk (EP lockstep) counts as ended, so it steps only while a
        peer of its group still runs rows. A vision LM (`rollout.vision_decode`): `images` and `spans` per row, M-RoPE
        slots."""
        prompt, valid = kv_cache.left_pad(rows, self.pad_id, self.ctx.device)  # [B, P]
        num_rows, max_new = len(rows), params.max_new_tokens
        kv = self._context(num_rows, prompt.size(1) + max_new)
        slots_pos, embedded = self._vision_prefill(prompt, valid, images or [None] * num_rows, max_new,
                                                   spans or [len(r) for r in rows])
        key_valid = None if bool(valid.all()) else torch.cat([valid, valid.new_ones(num_rows, max_new)], dim=1)
        out = ResponseBuffer.empty(num_rows, max_new, self.pad_id, self.ctx.device)
        slots = torch.arange(num_rows, device=self.ctx.device)  # chunk row held by each KV-cache slot
        alive = torch.ones(num_rows, dtype=torch.bool, device=self.ctx.device)
        step_input, mask = prompt, kv_cache.prefill_mask(valid)
        with self._recording(valid, max_new, padding) as routing:
            for step in range(max_new):
                end = kv.sequence_len_offset + step_input.size(1)
                hidden = self._forward(step_input, mask, kv, None if slots_pos is None else slots_pos[:, :, :end],
                                       embedded if step == 0 else None)
                if routing is not None:  # R3: this forward's experts, before the rows that end now are dropped
                    routing.after_forward(step, valid, slots, alive)
                tokens, logprobs, finished = self._next_tokens(hidden, params, generator, out, slots, alive, step)
                out.record(slots[alive], step, tokens[alive], logprobs[alive])
                done = finished & alive
                out.finish(slots[done], step, stopped=True)
                alive &= ~finished
                bar.update(1)
                num_alive = int(alive.sum())  # the one host sync per step
                if self._group_max(0 if padding else num_alive) == 0 or step == max_new - 1:  # EP: while any runs
                    bar.update(max_new - 1 - step)
                    break
                if 0 < num_alive <= alive.numel() // 2:  # stop decoding the finished rows
                    keep = alive.nonzero().squeeze(1)
                    kv_cache.compact(kv, keep)
                    slots, alive, tokens = slots[keep], alive[keep], tokens[keep]
                    key_valid = None if key_valid is None else key_valid[keep]
                    slots_pos = None if slots_pos is None else slots_pos[:, keep]
                step_input = torch.where(alive, tokens, self.pad_id).unsqueeze(1)  # [b, 1]
                mask = kv_cache.decode_mask(key_valid, kv.sequence_len_offset + 1)
                kv.enable_decode_mode()
            out.finish(slots[alive], max_new - 1, stopped=False)
            responses = out.to_responses()
            if routing is not None:
                for r, row in zip(responses, routing.rows([len(r.tokens) for r in responses])):
                    r.routing = row  # [prompt + response tokens, L, k]
        return responses

    @contextlib.contextmanager
    def _recording(self, valid: torch.Tensor, max_new: int, padding: bool):
        """R3: the chunk's routing recorder (`routing_record.RolloutRouting`), or None (no R3, a dense stage,
        a padding chunk); the routers route normally again after the block."""
        if padding or self.routing is None:
            yield None
            return
        with self.routing.start(valid.sum(1), valid.size(1) + max_new) as routing:
            yield routing

    def _generate_static(self, rows: list[list[int]], params: SamplingParams, bar,
                         images: list | None = None, spans: list[int] | None = None) -> list[Response]:
        """Prefill, then one decode step per token over the smallest bucket holding the running rows. `images`,
        `spans`: a vision LM's, per row (`rollout.vision_decode.static_prefill`)."""
        prompt, lengths = kv_cache.right_pad(rows, self.pad_id, self.ctx.device)  # [b, P]: the trainer's columns
        b, max_new = len(rows), params.max_new_tokens
        st = self.static.reserve(b, prompt.size(1) + max_new, max_new, self.ctx.device)
        stop_ids = self.static.stop_tensor(params.stop_token_ids, self.ctx.device)
        can_stop = bool(params.stop_token_ids or params.stop_strings)
        side = vision_side(self.model)
        vision = None if side is None else vision_decode.static_prefill(self.model, side, prompt, lengths,
                                                                        images or [None] * b,
                                                                        spans or [len(r) for r in rows])
        self.static.prefill(prompt, lengths, params, stop_ids, vision=vision)
        if side is not None:
            side.pending = None  # the prefill's DeepStack levels: used
        bar.update(1)
        bucket = bucket_for(b)
        for step in range(1, max_new + 1):
            if params.stop_strings:
                self.static.end_stop_strings(bucket, params, self.decode)
            if can_stop:  # one host sync per step, only when rows can end early
                num_alive = int((~st.done[:bucket]).sum())
                if num_alive == 0:
                    break
                if bucket_for(num_alive) < bucket:  # decode only the running rows from now on
                    st.compact((~st.done[:bucket]).nonzero().squeeze(1), bucket_for(num_alive))
                    bucket = bucket_for(num_alive)
            if step == max_new:
                break
            self.static.step(bucket, params, stop_ids, needed=prompt.size(1) + step)  # rows at slots < this
            bar.update(1)
        bar.update(max_new - step)
        return ResponseBuffer(st.out_tokens[:b, :max_new], st.out_logprobs[:b, :max_new], st.out_lengths[:b],
                              st.out_stopped[:b]).to_responses()

    def _vision_prefill(self, prompt, valid, images: list, max_new: int, spans: list[int]):
        """(M-RoPE positions [3, b, P + max_new] of the cache slots, the prefill's decoder_input) of a vision LM's
        chunk; (None, None) for a text model."""
        side = vision_side(self.model)
        if side is None:
            return None, None
        grids, layout = vision_decode.chunk_grids(images, prompt.device), vision_decode.image_layout(prompt, valid,
                                                                                                     spans, side)
        embedded = vision_decode.prefill_input(self.model, side, prompt, layout, images) if self.ctx.is_first_stage \
            else None  # the tower and embeddings on the first stage; every stage takes the positions
        return vision_decode.slot_positions(layout, valid, grids, side, max_new), embedded

    def _forward(self, input_ids: torch.Tensor, mask: Optional[torch.Tensor], kv, positions=None,
                 decoder_input=None) -> Optional[torch.Tensor]:
        """One forward of this stage's layers over input_ids [b, s] at the cache offset; the hidden state of
        the last position [b, h] on the last stage, None elsewhere (activations go to the next stage).
        `positions`: a vision LM's M-RoPE positions of slots [0, offset + s) ([3, b, offset + s]), with the
        prefill's `decoder_input` [s, b, h] (its image embeddings)."""
        b, s = input_ids.shape
        start = kv.sequence_len_offset
        position_ids = torch.arange(start, start + s, device=input_ids.device).expand(b, s)  # RoPE uses slots
        if positions is not None:
            position_ids = positions
        if not self.ctx.is_first_stage:
            cfg = self.model.config
            self.model.set_input_tensor(comm.recv_from_prev_stage((s, b, cfg.hidden_size), cfg.params_dtype, self.ctx))
        extra = {} if decoder_input is None else {"decoder_input": decoder_input}
        side = vision_side(self.model)
        if side is not None and decoder_input is None:
            side.pending = None  # a decode step: the prefill's DeepStack features (Qwen3-VL) are spent
        output = self.model(input_ids, position_ids, mask, inference_context=kv, runtime_gather_output=True, **extra)
        kv.increment_sequence_len_offset(s)
        if not self.ctx.is_first_stage:
            self.model.set_input_tensor(None)
        if not self.ctx.is_last_stage:
            comm.send_to_next_stage(output, self.ctx)  # [s, b, h]
            return None
        return output[:, -1]  # [b, 1, h] (megatron keeps the last position only) -> [b, h]

    def _next_tokens(self, hidden, params: SamplingParams, generator, out: ResponseBuffer, slots, alive, step):
        """(tokens [b], logprobs [b], finished [b]) of every cache slot, sampled on the last stage and
        broadcast to the other stages; finished = a stop token or stop string ended the row."""
        if self.ctx.is_last_stage:
            from rlhf_mcore.models.heads import lm_output_weight

            logits = comm.full_vocab_logits(hidden, lm_output_weight(self.model), self.model.vocab_size_unpadded,
                                       self.ctx)  # [b, V_padded] fp32
            tokens, logprobs = sample(logits, params.temperature, params.top_k, params.top_p, generator)
            finished = is_stop_token(tokens, params.stop_token_ids)  # [b] bool
            if params.stop_strings:
                tails = out.tails(slots[alive], step, tokens[alive], tail_window(params.stop_strings))
                hits = torch.tensor(stop_string_hits(tails, params.stop_strings, self.decode), dtype=torch.bool,
                                    device=tokens.device)  # bool even with no running rows (EP lockstep)
                finished[alive.nonzero().squeeze(1)] |= hits
            payload = comm.pack_step(tokens, logprobs, finished)
        else:
            payload = torch.empty(3, slots.numel(), dtype=torch.float64, device=self.ctx.device)
        return comm.unpack_step(comm.broadcast_from_last_stage(payload, self.ctx))
