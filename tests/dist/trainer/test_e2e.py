"""PPO and GRPO end to end under torchrun (gloo): finite losses, every trainable parameter changes, and
the whole RL loop (rollout included) gives the same metrics at TP/PP splits of one DP replica.

Every run of this file is a row of RUNS; the module fixture runs them in one launch per world size (the shared
worker's train_run case), and each test reads the runs it compares."""
import json

import pytest

from tests.launch import torchrun, worker
from tests.support.paths import CONFIGS
from tests.support.tiny_vl import mixed_size_shapes

pytestmark = pytest.mark.dist
STEPS = ("trainer.total_steps=2",)
PACKED = ("data.use_sequence_packing=true", "actor.max_tokens_per_gpu=64")
GRPO_DP = ("data.train_batch_size=4", "actor.ppo_mini_batch_size=2")
RM = "reward.model_path={rm}"  # filled in with the tiny reward model the fixture converts
# partial rollouts, 3 steps: step 1 decodes two batches and carries one, step 2 trains it a version late
ASYNC = ("trainer.total_steps=3", "async_training.partial_rollout=true", "async_training.staleness_threshold=1",
         "rollout.max_response_length=16", "async_training.round_tokens=4")
# label -> (ranks, config, overrides)
RUNS = {
    "grpo": (1, "tiny_grpo.yaml", STEPS),
    "grpo_tp2": (2, "tiny_grpo.yaml", STEPS + ("parallel.tp=2",)),
    "grpo_pp2": (2, "tiny_grpo.yaml", STEPS + ("parallel.pp=2",)),
    "grpo_dp2": (2, "tiny_grpo.yaml", STEPS + GRPO_DP),
    "grpo_dp2_packed": (2, "tiny_grpo.yaml", STEPS + GRPO_DP + PACKED),
    "grpo_async": (1, "tiny_grpo.yaml", ASYNC),
    "grpo_async_tp2": (2, "tiny_grpo.yaml", ASYNC + ("parallel.tp=2",)),
    "grpo_async_pp2": (2, "tiny_grpo.yaml", ASYNC + ("parallel.pp=2",)),
    "grpo_async_dp2": (2, "tiny_grpo.yaml", ASYNC + GRPO_DP),
    "grpo_async_continuous_dp2": (2, "tiny_grpo.yaml", ASYNC + GRPO_DP + ("rollout.native.static_on_cpu=true",)),
    # a vision LM (the tiny Qwen2.5-VL on the shapes task): rollout with images and the update, at PP2 (the tower
    # and image rows on the first stage, M-RoPE positions on both)
    "vlm": (1, "tiny_vlm_grpo.yaml", STEPS + ("trainer.val_before_train=false", "trainer.test_freq=0")),
    "vlm_pp2": (2, "tiny_vlm_grpo.yaml", STEPS + ("trainer.val_before_train=false", "trainer.test_freq=0",
                                                  "parallel.pp=2")),
    # ... with partial rollouts at a learning rate too small to move a weight: carried samples continue with their
    # images, and every trained token's rollout log-prob is the trainer's
    "vlm_async": (1, "tiny_vlm_grpo.yaml", ASYNC + ("trainer.val_before_train=false", "trainer.test_freq=0",
                                                    "actor.optim.lr=1e-30")),
    # ... with dynamic sampling at DP2, packed, on images of three sizes: the kept groups' rows go to their ranks with
    # their images, padded to one width over the rounds and the ranks
    "vlm_dapo_dp2": (2, "tiny_vlm_grpo.yaml", STEPS + PACKED + (
        "trainer.val_before_train=false", "trainer.test_freq=0", "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.metric=score", "model.hf_path={work}/shapes_mixed/tiny_vlm",
        "data.train_files={work}/shapes_mixed/train.parquet",
        "data.val_files={work}/shapes_mixed/test.parquet", "data.max_prompt_length=64", "actor.max_tokens_per_gpu=128")),
    "ppo": (1, "tiny_ppo.yaml", STEPS),
    "ppo_packed": (1, "tiny_ppo.yaml", STEPS + PACKED),
    "ppo_rule_only_1step": (1, "tiny_ppo.yaml", ("trainer.total_steps=1",)),
    "ppo_critic_warmup": (1, "tiny_ppo.yaml", STEPS + ("trainer.critic_warmup=2",)),
    "ppo_rm": (1, "tiny_ppo.yaml", STEPS + (RM,)),
    "ppo_tp2pp2": (4, "tiny_ppo.yaml", STEPS + ("parallel.tp=2", "parallel.pp=2")),
    "ppo_rm_tp2pp2": (4, "tiny_ppo.yaml", STEPS + (RM, "parallel.tp=2", "parallel.pp=2")),
    # 8 ranks, TP2 x PP2 x DP2: GRPO against DP2 alone (the same DP size samples alike), PPO with every role
    # (critic, reference, reward model) greedy against one rank (a greedy rollout is the same at any DP size)
    "grpo_tp2pp2dp2": (8, "tiny_grpo.yaml", STEPS + GRPO_DP + ("parallel.tp=2", "parallel.pp=2")),
    "ppo_rm_greedy": (1, "tiny_ppo.yaml", STEPS + (RM, "rollout.temperature=0")),
    "ppo_rm_greedy_tp2pp2dp2": (8, "tiny_ppo.yaml", STEPS + (RM, "rollout.temperature=0", "parallel.tp=2",
                                                               "parallel.pp=2")),
    "ppo_tp2_dp2": (4, "tiny_ppo.yaml", STEPS + ("parallel.tp=2", "data.train_batch_size=4",
                                                 "actor.ppo_mini_batch_size=4", "critic.ppo_mini_batch_size=4",
                                                 "trainer.test_freq=2", "data.val_batch_size=3",
                                                 "trainer.rollout_data_dir={work}/dumps_tp2_dp2/rollouts",
                                                 "trainer.validation_data_dir={work}/dumps_tp2_dp2/val")),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    """Every row of RUNS, one launch per world size: {label: what train_run reported}."""
    work = tmp_path_factory.mktemp("e2e")
    rm = str(work / "rm")  # a random tiny llama reward model on the byte vocabulary, converted (own process)
    torchrun("tools.bench.make_reward_model", 1, "--out", rm, timeout=300)
    mixed_size_shapes(work / "shapes_mixed")  # the VLM runs' images at three sizes
    for nproc in sorted({n for n, _, _ in RUNS.values()}):
        worker(nproc, *[("train_run", work / f"{label}.json", CONFIGS / config,
                         f"trainer.output_dir={work}/run_{label}", "trainer.save_freq=0", "trainer.resume=disable",
                         *(o.format(rm=rm, work=work) for o in overrides))
                        for label, (n, config, overrides) in RUNS.items() if n == nproc], timeout=900)
    found = {label: json.loads((work / f"{label}.json").read_text()) for label in RUNS}
    found["work"] = work
    return found


# Metrics that must agree across layouts of one DP replica (same prompts, same sampling seeds).
COMPARED = ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/entropy", "actor/grad_norm",
            "critic/vf_loss", "critic/advantages/mean")
# Metrics that do not depend on how rows fall into micro-batches (the loss functions' metrics are weighted by
# their tokens over the whole update, trainer/metrics.py).
PACKING_INVARIANT = ("critic/score/mean", "response_length/mean", "actor/loss", "actor/grad_norm", "critic/loss",
                     "critic/grad_norm", "critic/advantages/mean", "critic/values/mean", "actor/pg_loss",
                     "actor/entropy", "critic/vf_loss")


def check_trained(result: dict, steps: int) -> None:
    assert result["finite"], result["metrics"]
    assert len(result["metrics"]) == steps
    assert result["num_params"] > 0 and result["unchanged"] == [], result["unchanged"]


def assert_same_metrics(a: dict, b: dict, rtol: float = 1e-4, keys: tuple[str, ...] = COMPARED,
                        atol: float = 1e-6) -> None:
    for step_a, step_b in zip(a["metrics"], b["metrics"]):
        for key in keys:
            if key in step_a:
                assert step_b[key] == pytest.approx(step_a[key], rel=rtol, abs=atol), key


def test_grpo_two_ranks_tp_and_pp_match_one_rank(runs):
    base = runs["grpo"]
    check_trained(base, 2)
    for split in ("grpo_tp2", "grpo_pp2"):
        result = runs[split]
        check_trained(result, 2)
        assert_same_metrics(base, result)


def test_a_vision_lm_trains_alike_at_pp2(runs):
    """The whole GRPO step of a vision LM (images in the rollout's prefill and in every trainer pass) at PP2 gives
    the 1-rank run's metrics."""
    check_trained(runs["vlm"], 2)
    check_trained(runs["vlm_pp2"], 2)
    assert_same_metrics(runs["vlm"], runs["vlm_pp2"])


def test_dynamic_sampling_moves_a_vision_lms_rows_with_their_images(runs):
    """DAPO's dynamic sampling on the tiny VLM at DP2, packed, its images of three sizes: the groups kept from several
    generation rounds are exchanged between the ranks with their images (padded to one width: without it the
    exchange's concatenation fails, 32 against 36 patches), so the trainer's log-probs are the rollout's (fp32;
    measured 1.8e-7, and 9e-3 with each kept row given another group's image)."""
    result = runs["vlm_dapo_dp2"]
    check_trained(result, 2)
    assert max(m["filter_groups/num_gen_batches"] for m in result["metrics"]) > 1
    for m in result["metrics"]:
        assert m["rollout/mismatch_logp_abs_diff"] < 1e-5 and m["rollout/mismatch_exact_frac"] > 0.9, m


def test_partial_rollouts_continue_a_vision_lms_samples_with_their_images(runs):
    """Partial rollouts (rounds) on the tiny VLM: a sample continued in later rounds and steps is prefilled with its
    prompt's image each round, and the trained batch carries the images: with weights that do not move (lr 1e-30),
    the trainer's log-probs equal the rollout's for the tokens of every version (measured 1.6e-7)."""
    steps = runs["vlm_async"]["metrics"]
    assert len(steps) == 3 and max(m["async/staleness_max"] for m in steps) == 1.0
    assert all(m["async/samples_carried_total"] > 0 for m in steps)
    for m in steps:
        assert m["rollout/mismatch_logp_abs_diff"] < 1e-5 and m["rollout/mismatch_exact_frac"] > 0.9, m


ASYNC_METRICS = ("async/staleness_mean", "async/staleness_max", "async/off_policy_token_frac",
                 "async/samples_carried_total", "async/samples_dropped_total", "async/rounds")


def test_partial_rollouts_carry_samples_alike_at_tp2_pp2_and_dp2(runs):
    """Partial rollouts at TP2 and PP2 reproduce the 1-rank run, the carrying included (how many samples, how
    stale, how many rounds), and the carried tokens train a version late under the importance weights; at DP2
    the replicas' counts add up."""
    base = runs["grpo_async"]
    check_trained(base, 3)
    steps = base["metrics"]
    assert [m["async/staleness_max"] for m in steps] == [0.0, 1.0, 0.0]  # step 2 trains step 1's second batch
    assert steps[0]["async/samples_carried_total"] == 4 * 4 and steps[1]["async/rounds"] == 0  # 4 prompts x n=4
    assert steps[1]["rollout/mismatch_kl_k3"] > 0 and steps[0]["rollout/mismatch_exact_frac"] == 1.0
    for split in ("grpo_async_tp2", "grpo_async_pp2"):
        check_trained(runs[split], 3)
        assert_same_metrics(base, runs[split], keys=COMPARED + ASYNC_METRICS)
    dp = runs["grpo_async_dp2"]
    check_trained(dp, 3)
    assert [m["async/samples_carried_total"] for m in dp["metrics"]] == [
        m["async/samples_carried_total"] for m in steps]  # 2 prompts per replica, summed over 2 replicas
    cont = runs["grpo_async_continuous_dp2"]  # continuous batching on each replica (the static decoder on the CPU)
    check_trained(cont, 3)
    for m in cont["metrics"]:
        assert m["async/staleness_max"] <= 1 and m["async/samples_dropped_total"] == 0
        assert m["async/samples_carried_total"] % 4 == 0  # whole groups of n=4, summed over the replicas
    assert any(m["async/staleness_max"] == 1.0 for m in cont["metrics"])


def test_critic_warmup_trains_the_critic_alone(runs):
    """verl's trainer.critic_warmup=2 over 2 steps: every critic parameter changes and no actor parameter does;
    step 1 (same batch, same critic) equals the PPO run's."""
    warm, base = runs["ppo_critic_warmup"], runs["ppo"]
    assert warm["finite"] and len(warm["metrics"]) == 2 and warm["trained_roles"] == ["actor", "critic"]
    assert warm["params_by_role"]["actor"] > 0 and warm["params_by_role"]["critic"] > 0
    assert sorted(k.split(".")[0] for k in warm["unchanged"]) == ["actor"] * warm["params_by_role"]["actor"]
    assert all("actor/pg_loss" not in m and "critic/vf_loss" in m for m in warm["metrics"])
    for key in ("critic/score/mean", "critic/vf_loss", "critic/values/mean"):
        assert warm["metrics"][0][key] == pytest.approx(base["metrics"][0][key], rel=1e-6)
    # critic.value_head_init=zeros: the first step's values are exactly 0, so its advantages are the returns
    assert base["metrics"][0]["critic/values/mean"] == 0.0 and base["metrics"][0]["critic/values/std"] == 0.0
    assert base["metrics"][1]["critic/values/std"] > 0.0


def test_eight_ranks_tp2_pp2_dp2_equal_the_smaller_runs_and_the_plan(runs):
    """Issue 42's simulation of scale: TP2 x PP2 x DP2 on 8 gloo ranks equals DP2 alone (GRPO) and one rank (PPO
    with a critic, a reference and a reward model, greedy rollouts) to 1e-5 relative over 2 steps, and every
    rank's trained parameter count is the memory plan's."""
    for big, small in (("grpo_tp2pp2dp2", "grpo_dp2"), ("ppo_rm_greedy_tp2pp2dp2", "ppo_rm_greedy")):
        check_trained(runs[big], 2)
        check_trained(runs[small], 2)
        assert_same_metrics(runs[small], runs[big], rtol=1e-5, atol=1e-5)  # whitened advantages' mean is ~1e-6
        assert runs[big]["off_plan"] == [] and runs[small]["off_plan"] == []
    assert runs["ppo_rm_greedy_tp2pp2dp2"]["roles"] == ["actor", "critic", "ref", "reward"]


def test_ppo_four_ranks_tp_pp_dp(runs):
    """TP2 x PP2 (DP1) reproduces the 1-rank PPO run; TP2 x DP2 trains every parameter on every rank."""
    base = runs["ppo"]
    check_trained(base, 2)
    tp_pp = runs["ppo_tp2pp2"]
    check_trained(tp_pp, 2)
    assert_same_metrics(base, tp_pp)
    dp = runs["ppo_tp2_dp2"]
    check_trained(dp, 2)
    (val,) = dp["validations"]  # DP2, chunks of 3 prompts: every rank reports, the sums meet over DP
    assert val == dp["metrics"][-1] and len(dp["metrics"]) == 2  # step 2's one record holds its validation
    assert val["training/global_step"] == 2 and sorted(k for k in val if k.startswith("val-")) == [
        "val-aux/response_length/clip_ratio", "val-aux/response_length/mean", "val-core/tiny/vowels/acc/mean@1",
        "val-core/tiny/vowels/format/mean@1", "val-core/tiny/vowels/reward/mean@1"]
    assert val["actor/lr"] > 0 and val["critic/lr"] > 0 and -10 < val["critic/vf_explained_var"] <= 1
    assert 0 < val["val-aux/response_length/mean"] <= 16 and 0 <= val["val-core/tiny/vowels/reward/mean@1"] <= 1
    assert dp["metrics"][0]["train/tiny/vowels/reward/mean"] == pytest.approx(dp["metrics"][0]["critic/score/mean"])
    # verl's dumps: every sample of both DP replicas, written once (rank 0), scores matching the step's metrics
    dumps = runs["work"] / "dumps_tp2_dp2"
    steps = {p.name: [json.loads(x) for x in p.read_text().splitlines()] for p in (dumps / "rollouts").glob("*.jsonl")}
    assert sorted(steps) == ["1.jsonl", "2.jsonl"] and all(len(rows) == 8 for rows in steps.values())  # 4 prompts x 2
    mean = sum(r["reward"] for r in steps["1.jsonl"]) / 8
    assert mean == pytest.approx(dp["metrics"][0]["critic/score/mean"], abs=1e-6)
    (val_file,) = (dumps / "val").glob("*.jsonl")
    val_rows = [json.loads(x) for x in val_file.read_text().splitlines()]
    assert val_file.name == "2.jsonl" and {"input", "output", "ground_truth", "acc"} <= set(val_rows[0])
    assert sum(r["reward"] for r in val_rows) / len(val_rows) == pytest.approx(
        val["val-core/tiny/vowels/reward/mean@1"], abs=1e-6)


def test_ppo_every_role_tp2_pp2(runs):
    """PPO with all four roles in one process group (actor, critic, reference for the KL, a reward model on top
    of the rule reward): TP2 x PP2 reproduces the 1-rank run, reward-model scores included, and every parameter
    of both trainable roles changes."""
    base = runs["ppo_rm"]
    check_trained(base, 2)
    assert base["trained_roles"] == ["actor", "critic"] and base["roles"] == ["actor", "critic", "ref", "reward"]
    rule_only = runs["ppo_rule_only_1step"]
    assert rule_only["metrics"][0]["critic/score/mean"] != pytest.approx(base["metrics"][0]["critic/score/mean"])
    tp_pp = runs["ppo_rm_tp2pp2"]
    check_trained(tp_pp, 2)
    assert_same_metrics(base, tp_pp, keys=COMPARED + ("actor/reward_kl",))


def test_sequence_packing_reproduces_padded_runs(runs):
    """data.use_sequence_packing changes no global number: PPO on one rank (actor, critic, reference packed), and
    GRPO at DP2 where packing also deals rows out to balance tokens over the DP ranks: the exact global losses
    and the loss functions' token-weighted metrics (actor/pg_loss, actor/entropy, critic/vf_loss)."""
    base, result = runs["ppo"], runs["ppo_packed"]
    check_trained(result, 2)
    assert {"actor/loss", "actor/grad_norm", "critic/loss", "critic/values/mean"} <= set(result["metrics"][0])
    assert_same_metrics(base, result, keys=PACKING_INVARIANT)
    base, result = runs["grpo_dp2"], runs["grpo_dp2_packed"]
    check_trained(result, 2)
    assert_same_metrics(base, result, keys=PACKING_INVARIANT)
