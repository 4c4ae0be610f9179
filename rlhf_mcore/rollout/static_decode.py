"""Static-shape decoding for the native engine: a KV cache of fixed size and a decode step with no host
sync, no Python-int offsets and no allocation that depends on the step, so it can be captured once per
batch-size bucket as a CUDA graph and replayed for every token (gpt-fast `generate.py`, nanochat `engine.py`).

It runs the actor's own parameters (embedding, norms, QKV / output projections, MLP, final norm; with LoRA
adapters the projections' merged weights, refreshed before each rollout: `rollout.merged_weights`):
- a decode step computes each layer with the pure functions of `decode_layer` (megatron's arithmetic,
  RoPE from a cos / sin table); the pieces between the norms are optionally compiled by `torch.compile`
  (`compile_backend`, from `rollout.native.compile_decode`; a compile or capture error falls back to the eager
  functions, logged), while the norms and the SwiGLU run as the trainer's modules run them;
- the trainer's layout: row i's prompt fills cache slots [0, len_i) (right-padded in the prefill, plain
  causal attention as the trainer's forward runs it) and its response token t goes to slot len_i + t, the
  column the trainer's forward sees it at (RoPE of that position). Each row has its own device-resident
  position `pos[i]`; the cache holds rotated keys [L, B, G, T, D], written by indexing at (row, pos[i]).
  With left padding instead, a row's positions, RoPE roundings and attention tiles would all be shifted
  from the trainer's, and its log-probs with them (0.027 mean gap on SmolLM2 / GSM8K, docs/architecture.md);
- a decode query attends to the slots <= its row's position (and, in a sliding-window layer, > position - window:
  one mask per window per step) (a right-padded prompt's padding slots are
  overwritten by response tokens before they are reached), through one of `decode_layer.DECODE_ATTENTION`
  (`attention`, from `rollout.native.decode_attention`): "triton", the split-KV kernel of
  `kernels/decode_attention.py` that reads only the slots each row has written, or "sdpa", an additive mask
  built once per step, a key group's query heads passed as its query positions, over the cache cut to the
  slots written so far rounded up to `LENGTH_BLOCK` (one graph per batch and length bucket: masked slots
  change nothing, so the cut is exact and saves reading the unwritten end); a kernel error falls back
  to sdpa, logged;
- sampling, the log-prob and the stop-token test run inside the step too (`sampling.sample_plain`, one
  pass over the vocabulary, when there is no top-k / top-p; else `sampling.sample`), on fp32 logits never
  rounded to bf16 (`kernels.logits.logits_fp32`, exactly the trainer's), and its results are written into
  per-row response buffers at each row's next column (its length, device-resident; a row ends at a stop token or
  at its slot's limit), so rows may start and end at different steps (`rlhf_mcore.rollout.continuous`).

The prefill goes through megatron's own layer modules eagerly, with the layer's own SDPA core attention.
Where the layout or the model is not supported (TP/PP > 1, a core attention other than ours, a layer the
functional decode does not implement), the engine keeps megatron's eager inference path (`native.py`) and
says why (`graph_blockers`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import traceback
from typing import Callable, Optional

import torch

from rlhf_mcore.kernels.logits import logits_fp32
from rlhf_mcore.models.rope import attention_scaling
from rlhf_mcore.models.spec import active_window
from rlhf_mcore.rollout import decode_layer as fn
from rlhf_mcore.rollout.decode_state import DecodeState
from rlhf_mcore.rollout.merged_weights import MergedWeights
from rlhf_mcore.rollout.sampling import mask_padded_vocab, sample, sample_plain
from rlhf_mcore.rollout.stopping import stop_string_hits, tail_window

log = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
LENGTH_BLOCK = 128  # an attention that reads every slot it is given gets the cache cut to a multiple of this


def bucket_for(num_rows: int) -> int:
    """The smallest batch-size bucket holding num_rows rows (multiples of 256 above the table).

    >>> bucket_for(3), bucket_for(512), bucket_for(1500)
    (4, 512, 1536)
    """
    for b in BUCKETS:
        if b >= num_rows:
            return b
    return -(-num_rows // 256) * 256


def graph_blockers(model, ctx) -> list[str]:
    """Why the static decoder cannot run this model on this layout ([] = it can)."""
    from rlhf_mcore.models.attention import SDPAttention
    from rlhf_mcore.models.registry import MODEL_FAMILIES

    reasons = []
    if ctx.dims.tp != 1 or ctx.dims.pp != 1:
        reasons.append(f"tp={ctx.dims.tp}, pp={ctx.dims.pp} (static decoding needs tp=1, pp=1)")
    layers = getattr(getattr(model, "decoder", None), "layers", [])
    if not layers or not all(isinstance(layer.self_attention.core_attention, SDPAttention) for layer in layers):
        reasons.append("core attention is not SDPAttention (model.attention_backend must be sdpa)")
    family = getattr(model, "family", None)
    if family is not None and "static" not in MODEL_FAMILIES.get(family).decode_paths:
        reasons.append(f"model family {family} (its ModelSpec.decode_paths lacks 'static')")
    return reasons + [f"{name} (the functional decode layer does not implement it)"
                      for name in fn.functional_blockers(model)]


def rope_table(model, length: int) -> torch.Tensor:
    """[T, 1, 1, d] fp32 rotary angles of positions 0..T-1 (megatron's RotaryEmbedding). M-RoPE (a vision LM):
    its table at the same position on all three axes, which is a generated (text) token's."""
    if getattr(model, "position_embedding_type", None) == "mrope":
        positions = torch.arange(length, device=model.rotary_pos_emb.inv_freq.device).expand(3, 1, -1)
        return model.rotary_pos_emb(positions, model.mrope_section)
    return model.rotary_pos_emb(length)


def rotate(t: torch.Tensor, freqs: torch.Tensor, attention) -> torch.Tensor:
    """megatron's apply_rotary_pos_emb as its attention calls it; t [s, b, heads, d], freqs [s, 1, 1, d]."""
    from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb

    return apply_rotary_pos_emb(t, freqs, config=attention.config, mscale=attention_scaling(attention.config),
                                cp_group=attention.pg_collection.cp)


def bias_add(out_with_bias, residual: torch.Tensor) -> torch.Tensor:
    """megatron's bias-dropout-add in eval: residual + (out + bias)."""
    out, bias = out_with_bias
    return residual + (out if bias is None else out + bias)


def layer_step(layer, hidden, k_cache, v_cache, freqs, slots, attend) -> torch.Tensor:
    """One transformer layer over hidden [s, b, h] whose tokens sit at cache `slots` ([s] long); writes
    their rotated keys / values into k_cache / v_cache [b, G, T, D] and attends with `attend(q, k, v)`."""
    attention = layer.self_attention
    x = layer.input_layernorm(hidden)
    q, k, v = attention.get_query_key_value_tensors(x, None)  # [s, b, H, D], [s, b, G, D] x2
    q, k = rotate(q, freqs, attention), rotate(k, freqs, attention)
    k_cache.index_copy_(2, slots, k.permute(1, 2, 0, 3))
    v_cache.index_copy_(2, slots, v.permute(1, 2, 0, 3))
    hidden = bias_add(attention.linear_proj(attend(q, k, v)), hidden)
    return bias_add(layer.mlp(layer.pre_mlp_layernorm(hidden)), hidden)


def head_plain(logits: torch.Tensor, vocab_size: int, temperature: float):
    """logits [b, V_padded] fp32 -> (tokens [b], log-probs [b]) without top-k / top-p: padded ids masked,
    `sample_plain` (one pass over the vocabulary once fused). The LM-head GEMM stays outside (`emit`):
    `logits_fp32` is a cuBLAS call either way, and eager it needs no inductor lowering of `mm.dtype`."""
    return sample_plain(mask_padded_vocab(logits, vocab_size), temperature)


# Inductor keeps eager's bf16 roundings (it would otherwise keep fused intermediates in fp32), so the compiled
# pieces round as the trainer's eager ops do.
INDUCTOR_OPTIONS = {"emulate_precision_casts": True}


@dataclasses.dataclass
class DecodeFns:
    """The decode step's pure pieces between the norms (`decode_layer`), eager or compiled by torch.compile
    (`backend`: None = eager). The norms and the trainer's fused SwiGLU are never compiled here."""

    qkv_rope: Callable
    attention_out: Callable
    mlp_out: Callable
    head: Callable
    glu: Callable  # the unfused SwiGLU (compiled with the pieces; used where the trainer's MLP runs it unfused)
    backend: object = None  # a torch.compile backend (name or callable); None = eager

    @classmethod
    def build(cls, backend) -> "DecodeFns":
        pieces = (fn.qkv_rope, fn.attention_out, fn.mlp_out, head_plain, fn.glu_silu)
        if backend is not None:  # one graph each, reused by every layer (weights are inputs); the first
            # batch size compiles static, a second one compiles a batch-dynamic graph (torch's default)
            options = INDUCTOR_OPTIONS if backend == "inductor" else None
            pieces = tuple(torch.compile(f, backend=backend, fullgraph=True, options=options) for f in pieces)
        return cls(*pieces, backend=backend)

    def activation(self, config) -> Callable:
        """The trainer's MLP activation (`decode_layer.mlp_activation`): its fused kernel as is, else the unfused
        glu (SwiGLU: our glu piece, compiled with the others)."""
        return fn.mlp_activation(config, self.glu)


class StaticDecoder:
    """Prefill + CUDA-graphed decode steps over the actor's modules (tp = pp = 1). See the module doc.
    compile_backend: torch.compile backend of the decode step's pieces ("inductor"), None = eager.
    attention: a name in `decode_layer.DECODE_ATTENTION`."""

    def __init__(self, model, weight_fn, use_graphs: bool, compile_backend: Optional[str] = None,
                 attention: str = "sdpa"):
        self.model, self.weight_fn, self.use_graphs = model, weight_fn, use_graphs
        self.fns = DecodeFns.build(compile_backend)
        self.use_attention(attention)
        self.eps = model.decoder.layers[0].input_layernorm.eps
        self.weights: list[fn.LayerWeights] = []
        self.merged = MergedWeights(model)  # LoRA: the decode step reads merged weights (rollout.merged_weights)
        self.cos = self.sin = None  # [T, 1, 1, D] RoPE tables in the model's dtype
        attention = model.decoder.layers[0].self_attention
        self.heads = attention.num_attention_heads_per_partition
        self.groups = attention.num_query_groups_per_partition
        self.head_dim = attention.hidden_size_per_attention_head
        self.scale = attention.core_attention.softmax_scale
        self.windows = [getattr(layer.self_attention.core_attention, "window", None)  # None: full attention
                        for layer in model.decoder.layers]
        self.state: Optional[DecodeState] = None
        self.freqs: Optional[torch.Tensor] = None
        self.graphs: dict = {}  # (bucket, sampling key) -> CUDAGraph
        self.stop_ids: dict = {}  # stop-id tuple -> [V] bool mask (graphs read its memory)
        self.pool = None
        self.weight_ptrs: tuple = ()

    # ---- state --------------------------------------------------------------------------------------
    def reserve(self, batch: int, length: int, max_new: int, device, rows: int = 0) -> DecodeState:
        """A state of at least `batch` slots of `length` cache slots, `max_new` response columns and `rows`
        response rows (kept while it is large enough; graphs read its memory)."""
        if self.state is None or not self.state.fits(batch, length, max_new, rows):
            self.release()
            p = next(self.model.parameters())
            self.state = DecodeState.allocate(len(self.model.decoder.layers), bucket_for(batch), self.groups, length,
                                              self.head_dim, max_new, p.dtype, device, rows=rows)
            self.freqs = rope_table(self.model, length)
            self.cos, self.sin = fn.rope_tables(self.freqs, p.dtype, attention_scaling(self.model.config))
        ptrs = tuple(p.data_ptr() for p in self.model.parameters())
        if ptrs != self.weight_ptrs:  # parameters were re-allocated: graphs would read stale memory
            self.graphs.clear()
            self.weight_ptrs = ptrs
            self.weights = [fn.layer_weights(layer, self.merged.weight) for layer in self.model.decoder.layers]
        return self.state

    def use_attention(self, name: str) -> None:
        self.attention_name, self.attention = name, fn.DECODE_ATTENTION.get(name)

    @contextlib.contextmanager
    def attention_for(self, name: str):
        """Decode with the attention `name` inside the block (graphs are kept per attention), then go back to
        the previous one, unless a failure made this decoder fall back for good meanwhile."""
        before = self.attention_name
        self.use_attention(name)
        try:
            yield
        finally:
            if self.attention_name == name:
                self.use_attention(before)

    def refresh_weights(self) -> None:
        """Before a rollout: the LoRA-merged weights the decode step reads follow the adapters (in place)."""
        self.merged.refresh()

    def release(self) -> None:
        self.state, self.freqs, self.cos, self.sin, self.graphs, self.pool = None, None, None, None, {}, None
        if self.merged:  # the merged copies go with the graphs that read them
            self.merged.release()
            self.weights, self.weight_ptrs = [], ()

    def stop_tensor(self, stop_ids: tuple[int, ...], device) -> torch.Tensor:
        """The stop ids as a [V] bool mask over the vocabulary, living as long as the graphs reading it
        (one per tuple). A step reads it with a gather: `torch.isin` with more than a dozen ids takes its sorting
        path, whose `unique` waits on the host, which a CUDA graph cannot capture."""
        if stop_ids not in self.stop_ids:
            size = max([self.model.vocab_size_unpadded, *(i + 1 for i in stop_ids)])  # a sampled token is < V
            mask = torch.zeros(size, dtype=torch.bool, device=device)
            mask[list(stop_ids)] = True
            self.stop_ids[stop_ids] = mask
        return self.stop_ids[stop_ids]

    # ---- one step -----------------------------------------------------------------------------------
    def forward(self, tokens: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                attend_fn, vision=None) -> torch.Tensor:
        """Prefill through megatron's layer modules: tokens [b, s] at cache slots [s], keys / values written
        into k, v [L, b, G, >= s, D] -> final hidden [s, b, h]. `vision` (`vision_decode.VisionPrefill`, a vision
        LM's prompts): its embeddings with the images in, M-RoPE angles per token, DeepStack after its layers."""
        if vision is None:
            freqs = self.freqs.index_select(0, slots)  # [s, 1, 1, d]
            positions = slots.unsqueeze(0).expand(tokens.size(0), -1)
            hidden = self.model.embedding(input_ids=tokens, position_ids=positions)  # [s, b, h]
        else:
            freqs, hidden = vision.freqs, vision.hidden  # [s, b, 1, d], [s, b, h]
        for i, layer in enumerate(self.model.decoder.layers):
            hidden = layer_step(layer, hidden, k[i], v[i], freqs, slots,
                                lambda q, kk, vv, i=i: attend_fn(layer, q, kk, vv, k[i], v[i]))
            if vision is not None:
                hidden = vision.after_layer(i, hidden)
        return self.model.decoder.final_layernorm(hidden)

    def emit(self, hidden: torch.Tensor, sl, params, stop_ids: torch.Tensor, head=head_plain) -> None:
        """Sample from hidden [b, h] for slots `sl` (a slice, or [b] long), write token / log-prob at each row's
        next response column (its length; a finished row rewrites what it holds), advance the state. A row
        ends at a stop token or at its slot's limit. The logits are fp32, never rounded to bf16: the
        trainer's (`logits_fp32`)."""
        st = self.state
        vocab = self.model.vocab_size_unpadded
        logits = logits_fp32(hidden, self.weight_fn())  # [b, V_padded]
        if params.temperature == 0.0 or (params.top_k <= 0 and params.top_p >= 1.0):
            tokens, logprobs = head(logits, vocab, params.temperature)
        else:
            tokens, logprobs = sample(mask_padded_vocab(logits, vocab), params.temperature, params.top_k, params.top_p)
        was_done, rows = st.done[sl], st.slot_row[sl]
        finished = stop_ids[tokens]  # stop_tensor's mask
        col = st.out_lengths[rows].clamp(max=st.out_tokens.size(1) - 1).unsqueeze(1)  # [b, 1]
        st.out_tokens.index_put_((rows.unsqueeze(1), col), torch.where(was_done, st.out_tokens[rows, col[:, 0]],
                                                                       tokens).unsqueeze(1))
        st.out_logprobs.index_put_((rows.unsqueeze(1), col), torch.where(was_done, st.out_logprobs[rows, col[:, 0]],
                                                                         logprobs).unsqueeze(1))
        st.out_lengths.index_add_(0, rows, (~was_done).long())
        st.out_stopped.index_put_((rows,), st.out_stopped[rows] | (finished & ~was_done))
        st.done[sl] = was_done | finished | (col[:, 0] + 1 >= st.limit[sl])
        st.tokens_in[sl] = tokens

    def prefill(self, prompt: torch.Tensor, lengths: torch.Tensor, params, stop_ids,
                limits: Optional[torch.Tensor] = None, vision=None) -> None:
        """prompt [b, P] right-padded, lengths [b] long: rows 0..b-1 in slots 0..b-1, ending at `limits`
        ([b] long; default: the state's response columns). Slots from b up to the bucket are padding: done
        from the start, writing response rows of their own. `vision`: see `forward`."""
        b = prompt.size(0)
        st = self.state
        st.idle(b, min(bucket_for(b), st.done.numel()))
        st.out_lengths.zero_()
        st.out_stopped.zero_()
        rows = torch.arange(b, device=prompt.device)
        self.refill(slice(0, b), rows, prompt, lengths, params, stop_ids,
                    st.out_tokens.size(1) if limits is None else limits, vision)

    def refill(self, slots, rows: torch.Tensor, prompt: torch.Tensor, lengths: torch.Tensor, params, stop_ids,
               limits, vision=None) -> None:
        """Start response rows `rows` ([k] long) in cache slots `slots` (slice(0, k), or [k] long: slots whose
        rows have ended, refilled while the others decode on): the trainer's causal forward over prompt
        [k, P] (right-padded, lengths [k]) fills their cache slots [0, P), and each row's first token is
        sampled from its last prompt position. Other slots' cache rows are untouched."""
        st = self.state
        k, width = prompt.shape
        cols = torch.arange(width, device=prompt.device)
        st.start(slots, rows, limits)

        def attend(layer, q, kk, vv, k_cache, v_cache):  # no mask: causal, as the trainer's forward
            return layer.self_attention.core_attention(q, kk, vv, None)
        if isinstance(slots, slice):  # the first rows: written in place
            hidden = self.forward(prompt, cols, st.k[:, slots], st.v[:, slots], attend, vision)  # [P, k, h]
        else:  # scattered slots: written to a buffer of their own, then copied to their cache rows
            shape = (st.k.size(0), k, st.k.size(2), width, st.k.size(4))
            key, value = st.k.new_empty(shape), st.v.new_empty(shape)
            hidden = self.forward(prompt, cols, key, value, attend, vision)
            st.k[:, slots, :, :width] = key
            st.v[:, slots, :, :width] = value
        self.emit(hidden[lengths - 1, torch.arange(k, device=prompt.device)], slots, params, stop_ids)
        st.pos[slots] = lengths
        st.rope_delta[slots] = 0 if vision is None else vision.deltas

    def end_stop_strings(self, bucket: int, params, decode) -> None:
        """End the running rows of slots [:bucket] whose response so far completes a stop string."""
        st = self.state
        slots = (~st.done[:bucket]).nonzero().squeeze(1)
        if slots.numel() == 0:
            return
        rows = st.slot_row[slots]
        ends = st.out_lengths[rows]
        window = tail_window(params.stop_strings)
        # each row's last `window` columns, gathered on the device: rows at very different lengths (continuous
        # batching, later turns) read window tokens each, not the span from the shortest to the longest
        cols = (ends.unsqueeze(1) - window + torch.arange(window, device=ends.device)).clamp(min=0)
        block = st.out_tokens[rows.unsqueeze(1), cols].tolist()
        tails = [row[max(0, window - e):] for row, e in zip(block, ends.tolist())]
        hits = torch.tensor(stop_string_hits(tails, params.stop_strings, decode), dtype=torch.bool,
                            device=slots.device)
        st.done[slots[hits]] = True
        st.out_stopped[rows[hits]] = True

    def attended_length(self, needed: int) -> int:
        """The cache slots a decode step passes to the attention when `needed` slots are written: all of them
        for an attention that stops at each row's pos itself, else `needed` rounded up to LENGTH_BLOCK."""
        length = self.state.k.size(3)
        return length if self.attention.reads_to_pos else min(length, -(-needed // LENGTH_BLOCK) * LENGTH_BLOCK)

    def decode_step(self, b: int, params, stop_ids, length: int) -> None:
        """Eager body of one decode step over slots [:b] (what the graph captures): the functional layers
        (`decode_layer`) with the cache write and attention between their two halves; row i's token goes
        to cache slot pos[i] (its trainer column), with the RoPE of position pos[i] + rope_delta[i] (M-RoPE past
        a prompt's images; else pos[i]); attention over slots [:length]."""
        st, f = self.state, self.fns
        pos, rows = st.pos[:b], torch.arange(b, device=st.pos.device)
        windows = [active_window(w, length) for w in self.windows]  # a window covering `length` masks nothing
        masks = {w: self.attention.mask(pos, length, st.k.dtype, w) for w in set(windows)}
        rope_pos = pos + st.rope_delta[:b]
        cos, sin = (t.index_select(0, rope_pos).view(1, b, 1, -1) for t in (self.cos, self.sin))  # [1, b, 1, D]
        hidden = self.model.embedding(input_ids=st.tokens_in[:b].unsqueeze(1), position_ids=None)[0]  # [b, h]
        activation = f.activation(self.model.config)
        for i, w in enumerate(self.weights):
            x = hidden.unsqueeze(0)  # [1, b, h] with the same strides in every layer (compiled pieces guard them)
            q, k, v = fn.attention_in(x, w, cos, sin, self.groups, self.head_dim, self.eps, f.qkv_rope)
            k_cache, v_cache = st.k[i, :b], st.v[i, :b]
            k_cache[rows, :, pos] = k[0]  # [b, G, D] at (row, :, pos[row])
            v_cache[rows, :, pos] = v[0]
            attn = self.attention.attend(q, k_cache[:, :, :length], v_cache[:, :, :length], masks[windows[i]],
                                         self.scale)  # [1, b, H * D]
            hidden = fn.attention_out_mlp(attn, x, w, self.eps, activation, f.attention_out, f.mlp_out)[0]
        running = ~st.done[:b]
        self.emit(self.model.decoder.final_layernorm(hidden), slice(0, b), params, stop_ids, f.head)
        st.pos[:b].add_(running.long())  # a row that had ended stays where it is (its cache row is its own)

    def checked_decode_step(self, b: int, params, stop_ids, length: int) -> None:
        """decode_step; if its compiled pieces or attention kernel fail (the first call compiles), say so and
        retry with the plainer path. A failed step wrote nothing it will not rewrite: pos / col only advance
        at its end."""
        while True:
            try:
                return self.decode_step(b, params, stop_ids, length)
            except Exception as err:  # noqa: BLE001 (any compiler error: the plainer path computes the same)
                self._fall_back(err, "compile")

    def _fall_back(self, err: Exception, where: str) -> None:
        """Drop what failed: the attention kernel if it raised, else the compiled pieces; nothing left: raise."""
        first_line = f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
        if self.attention_name != "sdpa" and _raised_in(err, fn.kernel.__file__):
            log.warning("native rollout: the %s decode attention failed at %s (%s); using sdpa", self.attention_name,
                        where, first_line)
            self.use_attention("sdpa")
        elif self.fns.backend is not None:
            log.warning("native rollout: torch.compile (%s) of the decode step failed at %s (%s); decoding with the "
                        "eager functions", self.fns.backend, where, first_line)
            self.fns = DecodeFns.build(None)
        else:
            raise err
        self.graphs.clear()

    def step(self, b: int, params, stop_ids, needed: int) -> None:
        """One decode step over slots [:b] (a bucket) whose rows sit at slots < needed: a graph replay when
        graphs are on, else eager."""
        length = self.attended_length(needed)
        if not self.use_graphs:
            return self.checked_decode_step(b, params, stop_ids, length)
        key = (b, length, self.attention_name, params.temperature, params.top_k, params.top_p, params.stop_token_ids)
        graph = self.graphs.get(key)
        if graph is None:
            graph = self._capture(b, params, stop_ids, length)
            if graph is None:  # the step waits on the host: graphs are off (logged)
                return self.checked_decode_step(b, params, stop_ids, length)
            self.graphs[key] = graph
        graph.replay()

    def _capture(self, b: int, params, stop_ids, length: int):
        """Warm up on a side stream, then capture decode_step for bucket b. The decode state and the CUDA
        RNG state are restored afterwards, so a call that captures samples exactly what a replay would.
        A capture that fails with compiled pieces is retried with the eager ones (logged). A step that waits on
        the host fails its warm-up, before any capture (a failed capture would leave CUDA's default generator
        unusable for the rest of the process); if the eager one waits too, graphs are turned off (logged) and
        this returns None."""
        st = self.state
        saved = {f.name: getattr(st, f.name).clone() for f in dataclasses.fields(st) if f.name not in ("k", "v")}
        rng = torch.cuda.get_rng_state()

        def restore():  # capture ran nothing; the warm-up did: undo it (its draws advanced the generator too)
            for name, value in saved.items():
                getattr(st, name).copy_(value)
            torch.cuda.set_rng_state(rng)
        while True:
            try:
                graph = self._warm_up_and_capture(b, params, stop_ids, length)
                break
            except Exception as err:  # noqa: BLE001
                try:
                    self._fall_back(err, "CUDA-graph capture")
                except Exception:  # nothing left to drop
                    self._graphs_off_or_raise(err)
                    graph = None
                    break
                restore()
        restore()
        return graph

    def _graphs_off_or_raise(self, err: Exception) -> None:
        """A step that waits on the host, with nothing left to drop: graphs off (logged). A draw after an earlier
        failed capture: an error that says so. Anything else: `err`."""
        if POISONED_RNG in str(err):
            raise RuntimeError("native rollout: an earlier CUDA-graph capture in this process failed (logged "
                               "above), which leaves CUDA's random generator unusable; set "
                               "rollout.native.cuda_graphs=false to decode without graphs") from err
        if HOST_SYNC not in str(err):
            raise err
        log.warning("native rollout: the decode step waits on the host (%s), which a CUDA graph cannot capture; "
                    "decoding without CUDA graphs", str(err).splitlines()[0][:200])
        self.use_graphs = False

    def _warm_up_and_capture(self, b: int, params, stop_ids, length: int):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.checked_decode_step(b, params, stop_ids, length)  # compiles this bucket's pieces
            with host_syncs_raise():  # what a capture would reject raises here, with CUDA's generator intact
                self.checked_decode_step(b, params, stop_ids, length)
        torch.cuda.current_stream().wait_stream(side)
        self.pool = self.pool or torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.decode_step(b, params, stop_ids, length)
        return graph


HOST_SYNC = "synchronizing CUDA operation"  # torch's error under set_sync_debug_mode("error")
POISONED_RNG = "Offset increment outside graph capture"  # a draw after a failed capture (the generator's state)


@contextlib.contextmanager
def host_syncs_raise():
    """CUDA operations that wait on the host (`.item()`, `unique`, pageable copies) raise while inside."""
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(before)


def _raised_in(err: Exception, path: str) -> bool:
    """Whether err's traceback passes through the file `path`."""
    return any(frame.filename == path for frame in traceback.extract_tb(err.__traceback__))

