"""Worker of tests/dist/rollout/test_native.py, started once per layout (python at 1 rank, torchrun above).

Builds the tiny actor at --tp x --pp (identical weights at every layout), runs the SCENARIOS and saves
every rank's batches to OUT/rank{r}.pt. At world size 1 it also runs the CHECKS that need a no-cache
reference and writes OUT/checks.json: {check name: "ok" | traceback}.
"""
from __future__ import annotations

import argparse
import json
import os
import traceback

import torch

from rlhf_mcore.config import Config, ModelConfig, ParallelConfig, RolloutConfig
from rlhf_mcore.models.build import build_model
from rlhf_mcore.models.heads import lm_output_weight
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.parallel import destroy_distributed, init_distributed
from rlhf_mcore.rollout.base import EngineSetup, RolloutEngine, build_rollout_engine
from rlhf_mcore.rollout.sampling import mask_padded_vocab
from rlhf_mcore.rollout.types import SamplingParams

VOCAB, PAD, SEED = 250, 0, 1234
PROMPTS = [[3, 17, 42, 9, 100, 7], [5, 11], [200, 1, 2, 3, 4, 5, 6, 7, 8, 9], [77, 78, 79]]
STOP_IDS = tuple(range(1, VOCAB, 9))  # ~11% of the vocab: rows end at varied lengths (cache compaction)
SCENARIOS = {
    "greedy": SamplingParams(max_new_tokens=12, temperature=0.0),
    "sampled": SamplingParams(n=2, max_new_tokens=12, temperature=0.8, top_k=40, top_p=0.9, seed=3),
    "stopped": SamplingParams(n=3, max_new_tokens=16, temperature=1.0, stop_token_ids=STOP_IDS, seed=5),
}


def decode(ids: list[int]) -> str:
    return "".join(f"<{i}>" for i in ids)


def build(tp: int, pp: int):
    cfg = Config(model=ModelConfig(num_layers=4, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                                   num_query_groups=2, vocab_size=VOCAB), parallel=ParallelConfig(tp=tp, pp=pp))
    ctx = init_distributed(tp, pp, seed=SEED)
    model = build_model("actor", load_hf_config(cfg.model), cfg.model, cfg.parallel, ctx)
    return model, ctx


def engine(model, ctx, micro_batch_size: int = 0):
    """Built as the trainer builds it: the registry, rollout.native's options and an EngineSetup."""
    setup = EngineSetup(model=model, hf_config={}, ctx=ctx, pad_id=PAD, decode=decode,
                        micro_batch_size=micro_batch_size, replica_rows=0, seed=SEED)
    return build_rollout_engine(RolloutConfig(engine="native"), setup)


def as_dict(batch) -> dict:
    return {"tokens": batch.tokens, "prompt_lengths": batch.prompt_lengths, "response_lengths":
            batch.response_lengths, "rollout_logprobs": batch.rollout_logprobs, "finish_reasons": batch.finish_reasons}


def responses(batch) -> list[list[int]]:
    return [batch.tokens[i, p:p + n].tolist() for i, (p, n) in
            enumerate(zip(batch.prompt_lengths.tolist(), batch.response_lengths.tolist()))]


@torch.no_grad()
def full_logits(model, ids: list[int]) -> torch.Tensor:
    """No-cache reference: one full causal forward of an unpadded sequence -> [L, V_padded] masked logits."""
    model.eval()
    hidden = model(torch.tensor([ids]), torch.arange(len(ids)).unsqueeze(0), None)  # [1, L, h]
    return mask_padded_vocab(hidden[0] @ lm_output_weight(model).t(), VOCAB)


# ---- checks (world size 1) ------------------------------------------------------------------------------
def check_greedy_matches_naive_loop(model, ctx, out):
    params = SCENARIOS["greedy"]
    for prompt, got in zip(PROMPTS, responses(out["greedy"])):
        ids = list(prompt)
        for _ in range(params.max_new_tokens):
            ids.append(int(full_logits(model, ids)[-1].argmax()))
        assert got == ids[len(prompt):], f"prompt {prompt}: kv-cache {got} != naive {ids[len(prompt):]}"


def check_logprobs_match_full_forward(model, ctx, out):
    for name in SCENARIOS:
        batch, temperature = out[name], SCENARIOS[name].temperature or 1.0
        for i, (p, n) in enumerate(zip(batch.prompt_lengths.tolist(), batch.response_lengths.tolist())):
            ids = batch.tokens[i, :p + n]
            logp = torch.log_softmax(full_logits(model, ids.tolist()) / temperature, dim=-1)
            want = logp[p - 1:p + n - 1].gather(1, ids[p:].unsqueeze(1)).squeeze(1)
            got = batch.rollout_logprobs[i]
            torch.testing.assert_close(got[p:p + n], want, atol=1e-5, rtol=0, msg=f"{name} row {i}")
            assert not got[:p].any() and not got[p + n:].any(), f"{name} row {i}: log-probs outside the response"


def check_layout_and_n(model, ctx, out):
    batch, params = out["stopped"], SCENARIOS["stopped"]
    assert batch.tokens.size(0) == len(PROMPTS) * params.n
    for i in range(batch.tokens.size(0)):
        prompt = PROMPTS[i // params.n]
        assert batch.tokens[i, :len(prompt)].tolist() == prompt and batch.prompt_lengths[i] == len(prompt)
        assert not batch.tokens[i, batch.total_lengths[i]:].ne(PAD).any(), "right padding must be pad_id"
    rows = responses(batch)
    assert len({tuple(r) for r in rows}) > len(PROMPTS), "n seeded samples per prompt should differ"
    assert batch.response_mask.sum().item() == batch.response_lengths.sum().item()


def check_stop_tokens_and_length(model, ctx, out):
    batch, params = out["stopped"], SCENARIOS["stopped"]
    reasons = set()
    for row, reason in zip(responses(batch), batch.finish_reasons):
        hits = [j for j, t in enumerate(row) if t in params.stop_token_ids]
        if reason == "stop":
            assert hits == [len(row) - 1], f"stop token must be the last and only stop: {row}"
        else:
            assert not hits and len(row) == params.max_new_tokens, f"'length' row: {row}"
        reasons.add(reason)
    assert reasons == {"stop", "length"}, f"scenario should exercise both reasons (got {reasons})"
    greedy = responses(out["greedy"])
    eos = greedy[0][3]  # a token greedy decoding emits: the stopped run must cut right after it
    stopped = engine(model, ctx).generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=0.0,
                                                                  stop_token_ids=(eos,)))
    for full, row, reason in zip(greedy, responses(stopped), stopped.finish_reasons):
        end = full.index(eos) + 1 if eos in full else len(full)
        assert row == full[:end] and reason == ("stop" if eos in full else "length"), (full, row, reason)


def check_stop_strings(model, ctx, out):
    greedy = responses(out["greedy"])
    stop = f"{greedy[0][2]}><{greedy[0][3]}"  # spans tokens 2 and 3 of row 0: completed by token 3
    batch = engine(model, ctx).generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=0.0,
                                                                stop_strings=(stop, "<no-such>")))
    for full, row, reason in zip(greedy, responses(batch), batch.finish_reasons):
        ends = [k for k in range(1, len(full) + 1) if stop in decode(full[:k])]
        end = ends[0] if ends else len(full)
        assert row == full[:end] and reason == ("stop" if ends else "length"), (full, row, reason)
    assert batch.finish_reasons[0] == "stop" and len(responses(batch)[0]) <= 4


def check_micro_batching(model, ctx, out):
    for size in (1, 3):
        batch = engine(model, ctx, micro_batch_size=size).generate(PROMPTS, SCENARIOS["greedy"])
        assert torch.equal(batch.tokens, out["greedy"].tokens), f"micro_batch_size={size}"
        torch.testing.assert_close(batch.rollout_logprobs, out["greedy"].rollout_logprobs, atol=1e-5, rtol=0)


def check_vocab_padding_never_sampled(model, ctx, out):
    hot = SamplingParams(n=8, max_new_tokens=32, temperature=50.0, seed=9)  # near-uniform over 256 ids
    batch = engine(model, ctx).generate(PROMPTS, hot)
    assert int(batch.tokens.max()) < VOCAB and int(batch.tokens.max()) > VOCAB - 40


def check_ddp_wrapped_model(model, ctx, out):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp = DistributedDataParallel(config=model.config, ddp_config=DistributedDataParallelConfig(), module=model)
    eng = engine([ddp], ctx)  # what the trainer passes: its list of DDP-wrapped chunks
    assert eng.model is model
    eng.update_weights(ddp)
    assert torch.equal(eng.generate(PROMPTS, SCENARIOS["greedy"]).tokens, out["greedy"].tokens)


def check_modes_memory_registry(model, ctx, out):
    eng = engine(model, ctx)
    assert isinstance(eng, RolloutEngine)
    model.train()
    eng.generate(PROMPTS[:1], SamplingParams(max_new_tokens=2))
    assert model.training, "generate must restore train mode"
    eng.update_weights(model)
    eng.release_memory()
    try:
        eng.generate(PROMPTS[:1], SamplingParams(max_new_tokens=2))
        raise AssertionError("generate after release_memory must raise")
    except RuntimeError:
        pass
    eng.resume_memory()
    again = eng.generate(PROMPTS, SCENARIOS["greedy"])
    assert torch.equal(again.tokens, out["greedy"].tokens)
    assert eng.generate([], SCENARIOS["sampled"]).tokens.shape == (0, 0)  # a DP rank without prompts
    for bad in ([[1], []], "n=0"):
        try:
            eng.generate(bad, SamplingParams(n=0)) if bad == "n=0" else eng.generate(bad, SCENARIOS["greedy"])
            raise AssertionError(f"{bad}: must raise")
        except ValueError:
            pass
    try:
        build_rollout_engine(RolloutConfig(engine="nativ"), setup=None)
        raise AssertionError("unknown engine must raise")
    except ValueError as e:
        assert "Did you mean 'native'" in str(e)


def check_static_decode_matches_eager(model, ctx, out):
    """The static-shape decode step (what CUDA graphs capture), run eagerly on CPU, gives the eager
    engine's greedy tokens exactly and its log-probs to 1e-5; also with stop tokens ending rows at
    different steps (slot compaction into smaller buckets) and with stop strings."""
    from rlhf_mcore.rollout.static_decode import StaticDecoder

    static = engine(model, ctx)
    static.static = StaticDecoder(static.model, lambda: lm_output_weight(static.model), use_graphs=False)
    greedy = responses(out["greedy"])
    stops = tuple({row[k] for k, row in zip((1, 4, 7, 11), greedy)})
    for params in (SCENARIOS["greedy"], SamplingParams(n=3, max_new_tokens=12, temperature=0.0, stop_token_ids=stops),
                   SamplingParams(max_new_tokens=12, temperature=0.0,
                                  stop_strings=(f"{greedy[0][2]}><{greedy[0][3]}",))):
        want = engine(model, ctx).generate(PROMPTS, params)
        got = static.generate(PROMPTS, params)
        assert torch.equal(got.tokens, want.tokens), (params, responses(got), responses(want))
        assert got.finish_reasons == want.finish_reasons, (got.finish_reasons, want.finish_reasons)
        torch.testing.assert_close(got.rollout_logprobs, want.rollout_logprobs, atol=1e-5, rtol=0)
    assert len(set(map(len, responses(got)))) > 1 or params.stop_strings
    sampled = [static.generate(PROMPTS, SCENARIOS["sampled"]) for _ in range(2)]
    assert torch.equal(sampled[0].tokens, sampled[1].tokens), "seeded sampling must be reproducible"
    assert len({tuple(r) for r in responses(sampled[0])}) > len(PROMPTS), "samples of a prompt should differ"


CHECKS = {name[len("check_"):]: fn for name, fn in globals().items() if name.startswith("check_")}


def main(argv: list[str]):
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    model, ctx = build(args.tp, args.pp)
    eng = engine(model, ctx)
    out = {name: eng.generate(PROMPTS, params) for name, params in SCENARIOS.items()}
    torch.save({name: as_dict(b) for name, b in out.items()}, os.path.join(args.out, f"rank{ctx.rank}.pt"))
    if ctx.dims.world_size == 1:
        results = {}
        for name, fn in CHECKS.items():
            try:
                fn(model, ctx, out)
                results[name] = "ok"
            except Exception:  # reported per check by the pytest side
                results[name] = traceback.format_exc()
        with open(os.path.join(args.out, "checks.json"), "w") as f:
            json.dump(results, f)
    destroy_distributed()  # ranks leave together: a rank exiting with live gloo threads can abort ("terminate called")


def entry(argv: list[str]) -> None:
    main(argv)
