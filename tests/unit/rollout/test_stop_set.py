"""Both rollout engines stop at any id of the run's stop set, resolved by `trainer.inputs.stop_token_ids` from
the tokenizer's eos, config.json's eos and the chat template's end-of-turn token: the native engine (eager
decode and the static-shape step the CUDA graphs capture, run eagerly here) ends every row right after its
first stop id, each id of the set ending some row; the SGLang stand-in is handed the whole set."""
import json
from types import SimpleNamespace

import pytest
import torch

from rlhf_mcore.models.build import build_model
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.rollout.native import NativeRolloutEngine
from rlhf_mcore.rollout.sglang_engine import SGLangRolloutEngine
from rlhf_mcore.rollout.types import SamplingParams
from rlhf_mcore.tokenizer_bytes import ByteTokenizer
from rlhf_mcore.trainer.inputs import stop_token_ids
from tests.support.tiny import tiny_model_config
from tests.unit.rollout.test_sglang_engine import StandIn, setup_for

PROMPTS = [[3, 17, 42, 9, 100, 7], [5, 11], [200, 1, 2, 3, 4, 5, 6, 7, 8, 9], [77, 78, 79]]
GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)


class ChatBytes(ByteTokenizer):
    """The byte tokenizer (eos 256, never sampled by a 250-id model) with a chat template that ends every
    turn with the special token <|end|> = `end_id`."""

    def __init__(self, end_id: int):
        self.special_tokens = {"<|end|>": end_id}

    def apply_chat_template(self, messages, add_generation_prompt=True):
        text = "".join(f"{m['role']}: {m['content']}<|end|>\n" for m in messages)
        return text + ("assistant: " if add_generation_prompt else "")


@pytest.fixture(scope="module")
def actor(mcore_ctx):
    cfg = tiny_model_config()
    return build_model("actor", load_hf_config(cfg.model), cfg.model, cfg.parallel, mcore_ctx)


def responses(batch) -> list[list[int]]:
    return [batch.tokens[i, p:p + n].tolist() for i, (p, n) in
            enumerate(zip(batch.prompt_lengths.tolist(), batch.response_lengths.tolist()))]


def cut(full: list[int], stops) -> tuple[list[int], str]:
    """A greedy response as the stop set must end it: right after its first stop id."""
    hits = [k for k, t in enumerate(full) if t in stops]
    return (full[:hits[0] + 1], "stop") if hits else (full, "length")


def pick_stops(greedy: list[list[int]]) -> tuple[int, int]:
    """Two ids of the greedy responses such that, as a stop set, each of them ends some row."""
    candidates = list(dict.fromkeys(t for row in greedy for t in row[1:]))
    for a in candidates:
        for b in candidates:
            ends = {cut(row, (a, b))[0][-1] for row in greedy if cut(row, (a, b))[1] == "stop"}
            if a != b and ends == {a, b}:
                return a, b
    raise AssertionError(f"no two ids of the greedy responses end different rows: {greedy}")


def run_stop_set(tmp_path, greedy) -> tuple[int, ...]:
    """The run's stop set for a model dir whose config.json eos and chat template end a row each."""
    config_eos, end_of_turn = pick_stops(greedy)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "eos_token_id": config_eos}))
    cfg = SimpleNamespace(model=SimpleNamespace(hf_path=str(tmp_path)))
    stops = stop_token_ids(cfg, ChatBytes(end_of_turn))
    assert stops == (256, config_eos, end_of_turn)
    return stops


@pytest.mark.parametrize("decode", ["eager", "static"])
def test_native_engine_stops_at_any_id_of_the_set(actor, mcore_ctx, tmp_path, decode):
    from rlhf_mcore.models.heads import lm_output_weight
    from rlhf_mcore.rollout.static_decode import StaticDecoder

    engine = NativeRolloutEngine(actor, mcore_ctx, pad_id=0)
    greedy = responses(engine.generate(PROMPTS, GREEDY))
    stops = run_stop_set(tmp_path, greedy)
    if decode == "static":
        engine.static = StaticDecoder(engine.model, lambda: lm_output_weight(engine.model), use_graphs=False)
    batch = engine.generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=stops))
    want = [cut(row, stops) for row in greedy]
    assert responses(batch) == [r for r, _ in want]
    assert batch.finish_reasons == [reason for _, reason in want]
    assert {r[-1] for r, reason in want if reason == "stop"} == set(stops[1:])  # each id ended a row


def test_sglang_engine_is_handed_the_whole_set(actor, mcore_ctx, tmp_path):
    """The same set reaches SGLang's sampling params (stop_token_ids), and its own eos is not ignored."""
    from rlhf_mcore.trainer.phases import sampling_params

    class Recording(StandIn):
        def generate(self, input_ids, sampling_params, return_logprob):
            if sampling_params["max_new_tokens"]:
                self.seen = sampling_params
            return super().generate(input_ids, sampling_params, return_logprob)

    greedy = responses(NativeRolloutEngine(actor, mcore_ctx, pad_id=0).generate(PROMPTS, GREEDY))
    stops = run_stop_set(tmp_path, greedy)
    hf = load_hf_config(tiny_model_config().model)
    engine = SGLangRolloutEngine(setup_for(actor, hf, mcore_ctx), 1 << 20, Recording())
    engine.generate(PROMPTS, sampling_params(tiny_model_config(), stops, step=0))
    assert engine.engine.seen["stop_token_ids"] == list(stops) and engine.engine.seen["ignore_eos"] is False
    assert torch.is_tensor(engine.generate(PROMPTS, GREEDY).tokens)
