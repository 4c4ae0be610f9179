"""The reward-model role: an HF *ForSequenceClassification checkpoint, converted, scores sequences in our
megatron model exactly as transformers does (score head at the last valid token)."""
import torch

from rlhf_mcore.convert.mcore import load_full_state_dict
from rlhf_mcore.models.build import build_model
from rlhf_mcore.models.weights import hf_to_mcore
from rlhf_mcore.trainer.phases import reward_model_pass
from rlhf_mcore.trainer.roles import Roles
from tests.support.tiny import tiny_model_config
from tests.support.tiny_hf import tiny_reward_model


def test_reward_model_scores_match_transformers(mcore_ctx):
    torch.manual_seed(0)
    hf_model = tiny_reward_model()
    hf = hf_model.config.to_dict()
    cfg = tiny_model_config()
    reward = build_model("reward", hf, cfg.model, cfg.parallel, mcore_ctx)
    full = hf_to_mcore(hf_model.state_dict(), hf, role="reward")
    load_full_state_dict(reward, full, tp_rank=0, tp_size=1)

    lengths = torch.tensor([9, 5, 12])
    tokens = torch.randint(0, 256, (3, 12))
    tokens[torch.arange(12).unsqueeze(0) >= lengths.unsqueeze(1)] = 257  # right padding
    batch = {"tokens": tokens, "lengths": lengths}
    roles = Roles(actor=None, critic=None, ref=None, reward=reward)
    scores = reward_model_pass(roles, batch, cfg, mcore_ctx)  # [3, 12], the score at the last valid token
    ours = scores[torch.arange(3), lengths - 1]
    with torch.no_grad():
        theirs = hf_model(input_ids=tokens).logits[:, 0]
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    assert (scores != 0).sum() == 3  # nothing anywhere else
