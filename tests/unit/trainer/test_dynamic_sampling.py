"""DAPO's dynamic sampling (algorithm.filter_groups): the group filter and the round bookkeeping by hand, the
config rules, and a one-rank tiny run where half the prompts get a constant reward: those groups are never
trained, every step trains exactly train_batch_size groups, and the sampler advances by every round drawn."""
from types import SimpleNamespace

import pytest
import torch

from rlhf_mcore.config.load import ConfigError, load_config
from rlhf_mcore.trainer import dynamic_sampling as ds
from rlhf_mcore.trainer import phases
from rlhf_mcore.trainer.step_batch import StepBatch
from rlhf_mcore.trainer.step_log import format_step_line
from tests.support.paths import ROOT_STR as ROOT

TINY_DAPO = f"{ROOT}/configs/tiny_dapo.yaml"
CONSTANT = 7.0  # the reward of every even-indexed prompt's samples (a vowel fraction is at most 1)
EVEN_CONSTANT_REWARD = f'''
def reward(data_source, solution_str, ground_truth, extra_info):
    if extra_info["index"] % 2 == 0:
        return {CONSTANT}
    return sum(map(ord, solution_str)) % 97 / 97  # varies from sample to sample
'''


def test_keep_groups_by_hand():
    values = torch.tensor([0.1, 0.1, 0.1, 0.0, 1.0, 0.0, 2.0, 2.0, float("nan"), 5.0, 5.0, 5.000001])
    assert ds.keep_groups(values, 3).tolist() == [False, True, False, True]  # 0.1 x3: exactly equal (np.std > 0)
    assert ds.keep_groups(torch.tensor([1.0, 1.0]), 1).tolist() == [True, True]  # nothing to compare: kept (verl)
    assert ds.keep_groups(torch.tensor([1.0, 1.0, 1.0, 1.0]), 4).tolist() == [False]


def test_select_and_exchange_by_hand():
    keep = [[False, True, False, True], [True, True, False, False], [True, True, True, True]]
    picked = ds.select_groups(keep, 4)
    assert picked == [(0, 1), (0, 3), (1, 0), (1, 1)]  # round 2 is not needed; nothing beyond 4
    sends, index = ds.exchange_plan(picked, per_rank=2, dp=2)  # rank 0 made prompts 0-1, rank 1 prompts 2-3
    assert sends == [[(0, 1), (1, 0), (1, 1)], [(0, 1)]]
    assert index == [0, 3, 1, 2]  # gathered: rank 0's 3 sends, then rank 1's (padded to 3)
    gathered = [s for q in sends for s in q + [None] * (3 - len(q))]
    assert [gathered[i] for i in index] == [(0, 1), (0, 1), (1, 0), (1, 1)]  # pick order: (r, local prompt)
    assert ds.select_groups([[False, False]], 1) == []


def test_merge_round_metrics_adds_counts_and_averages_means():
    got = ds.merge_round_metrics([{"reward/errors": 1.0, "reward/timeouts": 0.0, "critic/acc/mean": 0.25},
                                  {"reward/errors": 2.0, "reward/timeouts": 1.0, "critic/acc/mean": 0.75}])
    assert got == {"reward/errors": 3.0, "reward/timeouts": 1.0, "critic/acc/mean": 0.5}


def round_batch(scores: list[float], n: int, tag: int) -> StepBatch:
    """A StepBatch of len(scores) rows: scores at the last token, tokens tagged by (round tag, row)."""
    rows = len(scores)
    tokens = torch.arange(rows).view(-1, 1).repeat(1, 3) + 100 * tag
    z = torch.zeros(rows, 3)
    return StepBatch(tokens=tokens, lengths=torch.full((rows,), 3), response_mask=z + 1, rollout_logp=z,
                     token_level_scores=z.index_put((torch.arange(rows), torch.full((rows,), 2)), torch.tensor(scores)),
                     group_index=torch.arange(rows // n).repeat_interleave(n), response_lengths=torch.full((rows,), 2),
                     prompt_lengths=torch.ones(rows, dtype=torch.long))


def fake_run(*overrides: str):
    cfg = load_config(TINY_DAPO, ["data.train_batch_size=3", "rollout.n=2", "actor.ppo_mini_batch_size=1",
                                  "actor.micro_batch_size_per_gpu=1", *overrides])
    ctx = SimpleNamespace(dims=SimpleNamespace(dp=1), dp_rank=0, device=torch.device("cpu"))
    return SimpleNamespace(cfg=cfg, ctx=ctx, group_index=lambda p: torch.arange(p).repeat_interleave(2))


def test_fill_batch_draws_rounds_until_full_and_keeps_the_first_kept_groups(monkeypatch):
    monkeypatch.setattr(ds, "sync_weights", lambda run: None)
    rounds = [[1.0, 1.0, 0.0, 1.0, 2.0, 2.0], [0.0, 0.0, 3.0, 3.0, 3.0, 3.0], [5.0, 6.0, 0.0, 1.0, 1.0, 0.0]]
    drawn = []

    def next_round(i):
        drawn.append(i)
        b = round_batch(rounds[i], 2, tag=i)
        return b, {"reward/errors": 1.0, "critic/acc/mean": float(i)}, {"acc": b.token_level_scores.sum(-1)}

    batch, metrics = ds.fill_batch(fake_run(), next_round(0), next_round, timings={})
    assert drawn == [0, 1, 2]  # round 0 kept 1 group, round 1 none, round 2 three (one too many)
    assert batch.num_rows == 6 and batch.group_index.tolist() == [0, 0, 1, 1, 2, 2]
    assert batch.tokens[:, 0].tolist() == [2, 3, 200, 201, 202, 203]  # round 0 group 1, round 2 groups 0 and 1
    assert batch.token_level_scores.sum(-1).tolist() == [0.0, 1.0, 5.0, 6.0, 0.0, 1.0]
    assert metrics == {"reward/errors": 3.0, "critic/acc/mean": 1.0, "filter_groups/num_gen_batches": 3.0,
                       "filter_groups/num_kept": 4.0, "filter_groups/num_filtered": 5.0}
    assert "rounds 3 kept 4 filtered 5" in format_step_line(1, 2, metrics)
    assert "rounds" not in format_step_line(1, 2, {"critic/score/mean": 0.5})


def with_images(batch: StepBatch, patches: int, tag: int) -> StepBatch:
    """Row r gets `patches` patches of value tag * 100 + r (one image of grid (1, 1, patches))."""
    rows = batch.num_rows
    pixels = (torch.arange(rows, dtype=torch.float32) + 100 * tag).view(-1, 1, 1).expand(rows, patches, 2)
    return batch.replace(pixel_values=pixels.clone(), image_grid_thw=torch.tensor([[[1, 1, patches]]] * rows))


def test_a_vision_lms_kept_rows_keep_their_images_across_rounds_of_other_sizes(monkeypatch):
    """Rounds whose images differ in size (3 and 5 patches) or that have none: each kept row's images are its
    own, zero-padded to the widest round (zeros past a row's grid read as no image)."""
    monkeypatch.setattr(ds, "sync_weights", lambda run: None)
    rounds = [with_images(round_batch([1.0, 1.0, 0.0, 1.0, 2.0, 2.0], 2, tag=0), 3, tag=0),
              round_batch([0.0, 1.0, 3.0, 3.0, 3.0, 3.0], 2, tag=1),  # a round without images
              with_images(round_batch([5.0, 6.0, 0.0, 0.0, 1.0, 0.0], 2, tag=2), 5, tag=2)]

    def next_round(i):
        return rounds[i], {}, {"acc": rounds[i].token_level_scores.sum(-1)}

    batch, _ = ds.fill_batch(fake_run(), next_round(0), next_round, timings={})
    assert batch.tokens[:, 0].tolist() == [2, 3, 100, 101, 200, 201]
    assert batch.pixel_values.shape == (6, 5, 2) and batch.image_grid_thw.shape == (6, 1, 3)
    assert batch.image_grid_thw[:, 0, 2].tolist() == [3, 3, 0, 0, 5, 5]
    assert batch.pixel_values[:, 0, 0].tolist() == [2.0, 3.0, 0.0, 0.0, 200.0, 201.0]
    assert batch.pixel_values[:2, 3:].abs().sum() == 0 and batch.pixel_values[4:, 4].tolist() == [[200.0] * 2,
                                                                                              [201.0] * 2]


def test_fill_batch_stops_after_max_num_gen_batches_and_passes_through_when_disabled(monkeypatch):
    monkeypatch.setattr(ds, "sync_weights", lambda run: None)
    equal = round_batch([1.0] * 6, 2, tag=0)
    first = (equal, {}, {"acc": equal.token_level_scores.sum(-1)})
    with pytest.raises(ds.FilterGroupsExhausted, match=r"^algorithm.filter_groups.max_num_gen_batches: 2 generation "
                                                       r"rounds found 0 of data.train_batch_size=3 groups"):
        ds.fill_batch(fake_run("algorithm.filter_groups.max_num_gen_batches=2"), first, lambda i: first, {})
    off = fake_run("algorithm.filter_groups.enable=false")
    assert ds.fill_batch(off, first, None, {}) == (equal, {})  # the first round, untouched


@pytest.mark.parametrize("overrides, expected", [
    (["algorithm.adv_estimator=gae"], "algorithm.filter_groups.enable: needs a group estimator, whose baseline comes "
     "from the prompt's samples (got algorithm.adv_estimator=gae). Use one of grpo"),
    (["algorithm.adv_estimator=reinforce_plus_plus", "rollout.n=1"], "algorithm.filter_groups.enable: needs "
     "rollout.n >= 2 samples per prompt to compare (got 1)."),
    (["algorithm.filter_groups.metric=accuracy"], "algorithm.filter_groups.metric: must be one of acc, format, "
     "reward, score, seq_reward, seq_final_reward (got 'accuracy')."),
    (["algorithm.filter_groups.metric=seq_final_reward", "algorithm.use_kl_in_reward=true"],
     "algorithm.filter_groups.metric: the KL penalty enters the reward after the groups are chosen"),
    (["algorithm.filter_groups.max_num_gen_batches=-1"], "algorithm.filter_groups.max_num_gen_batches: must be >= 0"),
])
def test_config_rules(overrides, expected):
    with pytest.raises(ConfigError) as e:
        load_config(TINY_DAPO, overrides)
    assert any(err.startswith(expected) for err in e.value.errors), e.value.errors


def test_config_rules_only_apply_when_enabled():
    cfg = load_config(TINY_DAPO, ["algorithm.filter_groups.enable=false", "algorithm.adv_estimator=remax"])
    assert cfg.algorithm.filter_groups.metric == "acc"


def test_constant_reward_groups_are_never_trained(tmp_path, mcore_ctx, monkeypatch):
    """Half the prompts score CONSTANT on every sample: their groups are generated, never trained. Each step
    trains exactly train_batch_size groups of non-zero reward spread; the sampler advanced one batch per round."""
    from rlhf_mcore.trainer.loop import train

    (tmp_path / "reward.py").write_text(EVEN_CONSTANT_REWARD)
    generated, trained = [], []
    score, update = phases.score, phases.update_role

    def recording_score(*args):
        batch, metrics, values = score(*args)
        generated.append(values["score"].clone())
        return batch, metrics, values

    def recording_update(name, state, batch, *args, **kwargs):
        trained.append({k: batch[k].clone() for k in ("token_level_scores", "group_index", "advantages")})
        return update(name, state, batch, *args, **kwargs)

    monkeypatch.setattr(phases, "score", recording_score)
    monkeypatch.setattr(phases, "update_role", recording_update)
    cfg = load_config(TINY_DAPO, [
        f"trainer.output_dir={tmp_path}/run", "trainer.total_steps=2", "trainer.save_freq=0", "trainer.resume=disable",
        "trainer.logger=[console]", "reward.overlong_buffer=0", f"reward.custom_fn={tmp_path}/reward.py:reward",
        "algorithm.filter_groups.metric=score", "rollout.max_response_length=8"])
    run = train(cfg)
    steps = [m for m in run.history if "filter_groups/num_gen_batches" in m]
    rounds = [int(m["filter_groups/num_gen_batches"]) for m in steps]
    assert len(steps) == 2 and len(generated) == sum(rounds) and len(trained) == 2
    assert (torch.cat(generated) == CONSTANT).sum() >= 8  # constant groups were generated ...
    for t in trained:
        scores = t["token_level_scores"].sum(-1)
        assert scores.numel() == cfg.data.train_batch_size * cfg.rollout.n  # exact batch size
        assert not (scores == CONSTANT).any()  # ... and never trained
        groups = scores.view(-1, cfg.rollout.n)
        assert (groups.amax(1) > groups.amin(1)).all() and t["group_index"].tolist() == [0] * 4 + [1] * 4 + \
            [2] * 4 + [3] * 4
        assert (t["advantages"].abs().sum(-1).view(-1, cfg.rollout.n).sum(1) > 0).all()  # every group has a gradient
    assert run.sampler.position == sum(rounds)  # one prompt batch drawn per round
    assert sum(m["filter_groups/num_kept"] + m["filter_groups/num_filtered"] for m in steps) == 4 * sum(rounds)


def test_each_round_of_a_step_samples_with_its_own_seed():
    """Rounds differ in the low 32 bits, the only ones a CPU generator (mt19937) uses; round 0 is the old seed."""
    from rlhf_mcore.rollout.sampling import replica_seed

    cfg = load_config(TINY_DAPO, [])
    seeds = [phases.sampling_params(cfg, (0,), 5, round_index=r).seed for r in range(3)] + \
        [phases.sampling_params(cfg, (0,), 6).seed]
    assert seeds[0] == cfg.trainer.seed * 1_000_003 + 5
    draws = [torch.rand(4, generator=torch.Generator().manual_seed(replica_seed(s, 0))).tolist() for s in seeds]
    assert len({tuple(d) for d in draws}) == 4


def test_reward_health_counts_the_calls_of_every_round():
    """Failed reward calls are summed over the rounds, and so are the calls: the error fraction stays a fraction."""
    from rlhf_mcore.trainer.guards import BadStepGuard, RewardHealthGuard
    from rlhf_mcore.trainer.run import Run

    cfg = load_config(TINY_DAPO, ["reward.max_error_steps=1"])  # 4 prompts x 4 samples a round
    run = SimpleNamespace(cfg=cfg, num_skipped_steps=0, unconfirmed=None, bad_steps=BadStepGuard(3),
                          reward_health=RewardHealthGuard(cfg.reward.max_error_frac, 1),
                          _confirm_checkpoint=lambda: None)
    metrics = {"reward/errors": 16.0, "filter_groups/num_gen_batches": 2.0}  # half of 2 rounds' 32 calls failed
    assert Run.check_health(run, 1, metrics) is None and metrics["reward/error_frac"] == 0.5
    metrics = {"reward/errors": 17.0, "filter_groups/num_gen_batches": 2.0}
    assert Run.check_health(run, 2, metrics) is not None  # more than reward.max_error_frac=0.5: stop
