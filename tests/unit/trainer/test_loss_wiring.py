"""Config keys reach the loss maths: actor.kl_cov_ratio / actor.kl_cov_coef into PolicyLossInputs, and
critic.loss_agg_mode ("" = the actor's, as verl) into the critic's aggregation; metrics carry their weights."""
import pytest
import torch

from rlhf_mcore.algorithms.aggregate import aggregate_loss
from rlhf_mcore.algorithms.value import compute_value_loss
from rlhf_mcore.config.load import ConfigError, load_config
from rlhf_mcore.trainer.losses import critic_agg_mode, critic_loss, policy_loss_inputs, shift_values
from rlhf_mcore.trainer.phases import critic_loss_fn


def micro_batch(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    mask = torch.tensor([[0, 1, 1, 1, 1, 1], [0, 0, 1, 0, 0, 0], [0, 1, 1, 1, 0, 0]], dtype=torch.float32)
    return {"response_mask": mask, "advantages": torch.randn(3, 6, generator=g),
            "returns": torch.randn(3, 6, generator=g), "values": torch.randn(3, 6, generator=g)}


def test_kl_cov_keys_reach_the_policy_loss():
    cfg = load_config(None, ["actor.kl_cov_coef=0.3", "actor.kl_cov_ratio=0.05"], check=False)
    mb = micro_batch()
    inp = policy_loss_inputs(mb, torch.zeros(3, 6), torch.zeros(3, 6), None, cfg.actor)
    assert (inp.kl_cov_coef, inp.kl_cov_ratio) == (0.3, 0.05)
    assert policy_loss_inputs(mb, torch.zeros(3, 6), torch.zeros(3, 6), None, load_config(
        None, [], check=False).actor).kl_cov_coef == 0.1  # verl's ppo_kl_coef


@pytest.mark.parametrize("overrides,mode", [([], "token-mean"), (["actor.loss_agg_mode=seq-mean-token-mean"],
                                                                  "seq-mean-token-mean"),
                                            (["actor.loss_agg_mode=seq-mean-token-mean",
                                              "critic.loss_agg_mode=token-mean"], "token-mean")])
def test_critic_aggregates_with_its_mode(overrides, mode):
    cfg = load_config(None, overrides, check=False)
    assert critic_agg_mode(cfg) == mode
    mb = micro_batch(1)
    output = torch.randn(3, 6, 1, generator=torch.Generator().manual_seed(2))
    loss_sum, count, metrics = critic_loss_fn(cfg)(mb, output)
    per_token, _ = compute_value_loss(shift_values(output), mb["returns"], mb["values"], mb["response_mask"],
                                      cfg.critic.cliprange_value)
    want_sum, want_count, _ = aggregate_loss(per_token, mb["response_mask"], mode)
    assert torch.allclose(loss_sum, want_sum) and int(count) == int(want_count)
    value, weight = metrics["critic/vf_clipfrac"]
    assert int(weight) == 9  # the micro-batch's valid tokens


def test_seq_mean_differs_from_token_mean_here():
    """The case above can tell the modes apart (rows of 5, 1 and 3 tokens)."""
    mb, output = micro_batch(1), torch.randn(3, 6, 1, generator=torch.Generator().manual_seed(2))
    token = critic_loss(mb, output, cliprange_value=0.5)
    seq = critic_loss(mb, output, cliprange_value=0.5, loss_agg_mode="seq-mean-token-mean")
    assert abs(float(token[0] / token[1]) - float(seq[0] / seq[1])) > 1e-3


@pytest.mark.parametrize("override,message", [
    ("critic.loss_agg_mode=token_mean", "critic.loss_agg_mode: must be one of"),
    ("actor.kl_cov_ratio=0", "actor.kl_cov_ratio: must be in (0.0, 1.0] (got 0.0). Use e.g. 0.0002."),
    ("actor.kl_cov_coef=-1", "actor.kl_cov_coef: must be >= 0 (got -1.0)."),
])
def test_bad_values_are_one_error_each(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override, "trainer.total_steps=1"])
    assert [e for e in err.value.errors if message in e], err.value.errors


def test_verl_names_of_the_kl_cov_keys_are_aliases():
    cfg = load_config(None, ["actor_rollout_ref.actor.policy_loss.ppo_kl_coef=0.2",
                             "actor_rollout_ref.actor.policy_loss.kl_cov_ratio=0.01"], check=False)
    assert (cfg.actor.kl_cov_coef, cfg.actor.kl_cov_ratio) == (0.2, 0.01)
