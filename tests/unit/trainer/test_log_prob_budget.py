"""actor.log_prob_max_tokens_per_gpu: the forward-only passes (old/ref log-probs, values, reward model) take
their own token budget, so a larger one cuts them into fewer micro-batches than the update, and the numbers
do not move (old and reference log-probs to 1e-6 in fp32 on the tiny model)."""
import pytest
import torch

from rlhf_mcore.config import ActorConfig, Config, DataConfig
from rlhf_mcore.config.load import load_config
from rlhf_mcore.train import main
from rlhf_mcore.trainer import phases
from rlhf_mcore.trainer.loop import train
from rlhf_mcore.trainer.schedule import split_micro_batches
from tests.support.paths import ROOT_STR as ROOT

TINY = f"{ROOT}/configs/tiny_grpo.yaml"
SEQ = 48  # tiny_grpo: data.max_prompt_length 32 + rollout.max_response_length 16


def ragged(lengths: list[int]) -> dict:
    seq = max(lengths)
    lens = torch.tensor(lengths)
    valid = torch.arange(seq).unsqueeze(0) < lens.unsqueeze(1)
    return {"tokens": (torch.arange(seq) + 1).repeat(len(lengths), 1) * valid, "lengths": lens}


@pytest.mark.parametrize("dynamic, pack", [(True, False), (False, True)])
def test_the_forward_only_budget_gives_fewer_micro_batches(dynamic, pack):
    cfg = Config(data=DataConfig(use_sequence_packing=pack), actor=ActorConfig(
        use_dynamic_bsz=dynamic, max_tokens_per_gpu=64, log_prob_max_tokens_per_gpu=256))
    update, forward = phases.micro_batching(cfg, cfg.actor), phases.micro_batching(cfg, cfg.actor, forward_only=True)
    assert (update["max_tokens"], forward["max_tokens"]) == (64, 256)
    batch = ragged([40, 30, 30, 20, 20, 20, 10, 10])
    num_update, num_forward = (len(split_micro_batches(batch, **split)) for split in (update, forward))
    assert num_forward < num_update, (num_forward, num_update)


def test_the_forward_only_budget_defaults_to_the_update_and_needs_token_budgets():
    same = Config(actor=ActorConfig(use_dynamic_bsz=True, max_tokens_per_gpu=64))
    assert phases.micro_batching(same, same.actor, forward_only=True) == phases.micro_batching(same, same.actor)
    fixed = Config(actor=ActorConfig(log_prob_max_tokens_per_gpu=256))  # fixed-size micro-batches: unused
    assert phases.micro_batching(fixed, fixed.actor, forward_only=True)["max_tokens"] == 0
    critic = Config(actor=ActorConfig(use_dynamic_bsz=True, log_prob_max_tokens_per_gpu=256))
    assert phases.micro_batching(critic, critic.critic)["max_tokens"] == 0  # the critic's update keeps its own


def one_step(tmp_path, monkeypatch, *overrides) -> tuple[dict, list[int]]:
    """One tiny GRPO step with the KL loss (a reference): the forward passes' outputs and every split's size."""
    cfg = load_config(TINY, [
        f"trainer.output_dir={tmp_path}", "trainer.total_steps=1", "trainer.save_freq=0", "trainer.resume=disable",
        "trainer.logger=[console]", "trainer.export_hf=false", "actor.use_kl_loss=true",
        f"actor.max_tokens_per_gpu={SEQ}", *overrides])
    seen, sizes = {}, []
    forward, split = phases.forward_passes, phases.split_micro_batches

    def record_forward(*args, **kwargs):
        batch = forward(*args, **kwargs)
        mask = batch.response_mask.bool()  # log-probs beyond a row's tokens are not defined (padding)
        seen.update(tokens=batch.tokens.clone(), old_logp=batch.old_logp[mask], ref_logp=batch.ref_logp[mask])
        return batch

    def record_split(*args, **kwargs):
        mbs = split(*args, **kwargs)
        sizes.append(len(mbs))
        return mbs

    monkeypatch.setattr(phases, "forward_passes", record_forward)
    monkeypatch.setattr(phases, "split_micro_batches", record_split)
    train(cfg)
    monkeypatch.undo()
    return seen, sizes


@pytest.mark.parametrize("budgets", ["actor.use_dynamic_bsz=true", "data.use_sequence_packing=true"])
def test_old_and_ref_log_probs_do_not_move(tmp_path, mcore_ctx, monkeypatch, budgets):
    base, base_sizes = one_step(tmp_path / "base", monkeypatch, budgets)
    big, big_sizes = one_step(tmp_path / "big", monkeypatch, budgets, f"actor.log_prob_max_tokens_per_gpu={4 * SEQ}")
    assert big_sizes[0] < base_sizes[0], (big_sizes, base_sizes)  # the first split: the forward passes
    assert big_sizes[1:] == base_sizes[1:]  # the update's micro-batches are unchanged
    assert torch.equal(big["tokens"], base["tokens"]) and base["old_logp"].dtype == torch.float32
    for key in ("old_logp", "ref_logp"):
        torch.testing.assert_close(big[key], base[key], atol=1e-6, rtol=0, msg=key)


@pytest.mark.parametrize("value, problem", [("-1", "must be >= 0 (got -1)"),
                                            (str(SEQ - 8), "must hold one sequence of data.max_prompt_length"),
                                            (str(1 << 40), "above the largest accepted value")])
def test_a_bad_budget_is_one_config_error(capsys, value, problem):
    assert main(["--config", TINY, "--validate-only", "actor.use_dynamic_bsz=true",
                 f"actor.log_prob_max_tokens_per_gpu={value}"]) == 2
    err = capsys.readouterr().err
    problems = [line for line in err.splitlines() if line.startswith("  - ")]
    assert len(problems) == 1 and problems[0].startswith("  - actor.log_prob_max_tokens_per_gpu: "), err
    assert problem in problems[0] and "Traceback" not in err, err
