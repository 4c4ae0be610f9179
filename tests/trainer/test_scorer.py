"""Scoring a rollout: rewards by data_source on the decoded responses, format and overlong penalties,
accuracy and error counts."""
import dataclasses

import torch

from rlhf_mcore.data.schema import PromptRow
from rlhf_mcore.rollout.types import RolloutBatch
from rlhf_mcore.run_reward import Scorer
from rlhf_mcore.tokenizer_bytes import ByteTokenizer
from tests.conftest import tiny_model_config


def rollout_of(prompt: str, responses: list[str]) -> RolloutBatch:
    tok = ByteTokenizer()
    p = tok.encode(prompt)
    rows = [p + tok.encode(r) for r in responses]
    width = max(map(len, rows))
    tokens = torch.tensor([r + [tok.pad_id] * (width - len(r)) for r in rows])
    return RolloutBatch(tokens=tokens, prompt_lengths=torch.tensor([len(p)] * len(rows)),
                        response_lengths=torch.tensor([len(r) for r in responses]),
                        rollout_logprobs=torch.zeros(tokens.shape), finish_reasons=["stop"] * len(rows))


def test_rewards_penalties_and_accuracy(mcore_ctx):
    cfg = tiny_model_config()
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, max_response_length=12),
                              reward=dataclasses.replace(cfg.reward, num_workers=1, format_penalty=0.5,
                                                         overlong_buffer=4, overlong_penalty_factor=1.0))
    prompt = PromptRow(index=0, data_source="openai/gsm8k", messages=({"role": "user", "content": "2+2"},),
                       ability="math", ground_truth="4", extra_info={})
    responses = ["#### 4", "so 4", "#### 5", "#### 4 ok yes"]  # right; no format; wrong; right but long
    scores, metrics = Scorer(cfg, ByteTokenizer(), mcore_ctx)(rollout_of("Q: 2+2?", responses), [prompt], 4)
    # overlong: 12-token cap, 4-token buffer: length 13 -> past the cap -> -1.0; others are short.
    assert scores.tolist() == [1.0, -0.5, 0.0, 0.0]
    assert metrics["critic/acc/mean"] == 0.5 and metrics["reward/errors"] == 0
