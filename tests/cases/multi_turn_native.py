"""Worker of tests/dist/rollout/test_native.py (torchrun, gloo, 1 or 2 ranks: TP1, TP2 or PP2):
a multi-turn rollout through the real native engine on a tiny bf16 megatron model, then the same token rows
fed to the trainer's forward; every turn's text is parsed as a calculator call (a scripted parser: random
weights write no `<tool_call>`), so each sample runs until max_turns or its budget with real tool turns.

    torchrun --nproc_per_node 2 -m tests.worker multi_turn_native OUT.json [tp|pp]

Rank 0 writes: the mean |rollout - trainer| log-prob gap over policy tokens (loss mask 1) of the multi-turn
rollout and of a single-turn rollout of the same prompts, the turns per row, whether every row's tokens are
prompt + its turns' sampled ids + the tool turns' ids exactly, the loss-mask count on tool-turn tokens, the
rows (for the comparison across layouts) and whether every rank holds the same rows.
"""
from __future__ import annotations

import json
import os

import torch

from rlhf_mcore.agent.parsers import ToolCall
from rlhf_mcore.chat import tool_delta_ids
from rlhf_mcore.models.build import build_model
from rlhf_mcore.models.logprobs import token_logprobs
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.parallel import destroy_distributed, init_distributed
from rlhf_mcore.rollout.modes import Rollout
from rlhf_mcore.rollout.native import NativeRolloutEngine, unwrap_model
from rlhf_mcore.rollout.types import SamplingParams
from rlhf_mcore.tokenizer_bytes import ByteTokenizer
from tests.support.multi_turn import Row, calculator_executor, tool_env
from tests.support.tiny import tiny_model_config

PARAMS = SamplingParams(n=2, max_new_tokens=64, temperature=1.0, seed=7)
TURN = 10  # each assistant turn: at most this many sampled tokens (TurnCap), so every sample takes 3 turns


def always_call(text: str) -> list:
    return [ToolCall("calculator", {"expression": "6*7"})]


def trainer_gap(model, ctx, batch) -> tuple[float, int]:
    """Mean |trainer log-prob - rollout log-prob| over the loss-mask tokens, and their count."""
    diffs = []
    with torch.no_grad():
        for i, length in enumerate(batch.total_lengths.tolist()):
            ids = batch.tokens[i:i + 1, :length]
            hidden = model(ids, torch.arange(length)[None], None)
            logp, _ = token_logprobs(model, hidden, ids, ctx.pgs.tp, temperature=PARAMS.temperature)
            mask = batch.loss_mask[i, :length]
            diffs.append((logp[0] - batch.rollout_logprobs[i, :length])[mask].abs())
    gaps = torch.cat(diffs)
    return gaps.mean().item(), gaps.numel()


class TurnCap:
    """The engine, each call's response cut to TURN tokens (so every sample takes several turns)."""

    def __init__(self, engine):
        self.engine, self.calls, self.sampled = engine, [], []  # per call: prefixes, sampled ids

    def generate(self, prompts, params, show_progress=False):
        import dataclasses

        self.calls.append([list(p) for p in prompts])
        cut = dataclasses.replace(params, max_new_tokens=min(TURN, params.max_new_tokens))
        batch = self.engine.generate(prompts, cut)
        self.sampled.append([row[s:s + n] for row, s, n in zip(batch.tokens.tolist(), batch.prompt_lengths.tolist(),
                                                               batch.response_lengths.tolist())])
        return batch


def main(out: str, layout: str = "tp") -> None:
    """layout "tp": TP = world size; "pp": PP = world size (the trainer's forward is not run: tokens only)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    tp, pp = (world, 1) if layout == "tp" else (1, world)
    ctx = init_distributed(tp=tp, pp=pp, seed=1234)
    cfg = tiny_model_config(dtype="bf16", vocab_size=258)
    cfg.parallel.tp, cfg.parallel.pp = tp, pp
    model = unwrap_model(build_model("actor", load_hf_config(cfg.model), cfg.model, cfg.parallel, ctx))
    model.eval()
    tok = ByteTokenizer()
    g = torch.Generator().manual_seed(0)
    prompts = [Row(tuple(torch.randint(1, 250, (int(n),), generator=g).tolist()))
               for n in torch.randint(3, 12, (4,), generator=g)]
    executor = calculator_executor() if ctx.pgs.mp.rank() == 0 else None
    env = tool_env(tok, executor, parse=always_call, max_turns=3)
    env.ctx = ctx
    engine = TurnCap(NativeRolloutEngine(model, ctx, pad_id=tok.pad_id, decode=tok.decode))
    multi = Rollout(engine, "multi_turn", env).generate(prompts, PARAMS)
    single = Rollout(NativeRolloutEngine(model, ctx, pad_id=tok.pad_id), "single_turn").generate(prompts, PARAMS)
    delta = tool_delta_ids(tok, ["42"])
    exact, tool_mask = True, 0
    for i, spans in enumerate(multi.turns.spans):
        row = multi.tokens[i, :multi.total_lengths[i]].tolist()
        want = list(prompts[i // PARAMS.n].prompt_ids)
        for k, (a, b) in enumerate(spans):
            want += engine.sampled[k][i]  # what the engine sampled in turn k (every row runs every turn here)
            if k < len(spans) - 1:
                want += delta
                tool_mask += int(multi.loss_mask[i, b:b + len(delta)].sum())
        exact &= row == want
    multi_gap, multi_tokens = trainer_gap(model, ctx, multi) if pp == 1 else (None, int(multi.loss_mask.sum()))
    single_gap, single_tokens = trainer_gap(model, ctx, single) if pp == 1 else (None, int(single.loss_mask.sum()))
    rows = [None] * world
    torch.distributed.all_gather_object(rows, multi.tokens.tolist())
    if executor is not None:
        executor.close()
    if torch.distributed.get_rank() == 0:
        result = {"tp": tp, "pp": pp, "tokens": rows[0], "same_on_every_rank": all(r == rows[0] for r in rows),
                  "multi_gap": multi_gap, "single_gap": single_gap, "multi_tokens": multi_tokens,
                  "single_tokens": single_tokens, "num_turns": multi.turns.num_turns,
                  "tool_calls": multi.turns.tool_calls, "tool_errors": multi.turns.tool_errors,
                  "exact_rows": exact, "tool_mask": tool_mask, "engine_calls": len(engine.calls),
                  "prefixes_exact": engine.calls[1] == [multi.tokens[i, :multi.turns.spans[i][1][0]].tolist()
                                                         for i in range(len(multi.turns.spans))
                                                         if len(multi.turns.spans[i]) > 1]}
        with open(out, "w") as f:
            json.dump(result, f)
    destroy_distributed()


def entry(argv: list[str]) -> None:
    main(*argv)
