"""Dynamic sampling across processes: two DP ranks (gloo) agree on the rounds and on the groups they train,
which are exactly the first train_batch_size groups with non-zero spread in (round, global prompt) order; a
run resumed from a mid-run checkpoint repeats the uninterrupted run's next step bitwise."""
import json

import pytest

from tests.launch import cli, worker
from tests.support.paths import CONFIGS
from tests.support.reliability import TIMING_KEYS
from tests.unit.trainer.test_dynamic_sampling import CONSTANT, EVEN_CONSTANT_REWARD

TINY_DAPO = str(CONFIGS / "tiny_dapo.yaml")
pytestmark = [pytest.mark.dist, pytest.mark.slow]


def run_ranks(tmp_path, nproc: int, *overrides: str) -> list[dict]:
    out = tmp_path / "result"
    worker(nproc, ("dynamic_sampling", out, TINY_DAPO, f"trainer.output_dir={tmp_path}/run", "trainer.save_freq=0",
                   "trainer.resume=disable", "trainer.logger=[console]", *overrides))
    return [json.loads((tmp_path / f"result.{r}.json").read_text()) for r in range(nproc)]


def steps_of(events: list[dict]) -> list[tuple[list[dict], dict]]:
    """(the rounds generated, the batch trained) per step, from one rank's event list."""
    steps, rounds = [], []
    for e in events:
        if "round" in e:
            rounds.append(e["round"])
        else:
            steps.append((rounds, e["trained"]))
            rounds = []
    return steps


def expected_rows(ranks_rounds: list[list[dict]], target: int, n: int) -> list[list[list[int]]]:
    """Independent of the trainer's code: the token rows each rank should train, from what every rank made."""
    picked = []
    for r in range(len(ranks_rounds[0])):
        for rank_rounds in ranks_rounds:  # rank-major within a round: rank q holds prompts q*P .. q*P+P-1
            rnd = rank_rounds[r]
            for g in range(len(rnd["values"]) // n):
                vals = rnd["values"][g * n:(g + 1) * n]
                if max(vals) > min(vals) and len(picked) < target:
                    picked.append(rnd["tokens"][g * n:(g + 1) * n])
    per_rank = target // len(ranks_rounds)
    return [[row for group in picked[q * per_rank:(q + 1) * per_rank] for row in group]
            for q in range(len(ranks_rounds))]


def test_two_ranks_agree_on_rounds_and_train_the_first_kept_groups(tmp_path):
    (tmp_path / "reward.py").write_text(EVEN_CONSTANT_REWARD)
    results = run_ranks(tmp_path, 2, "trainer.total_steps=2", "rollout.max_response_length=8",
                       "reward.overlong_buffer=0", f"reward.custom_fn={tmp_path}/reward.py:reward",
                       "algorithm.filter_groups.metric=score")
    assert [r["dp_rank"] for r in results] == [0, 1]
    per_rank = [steps_of(r["events"]) for r in results]
    assert len(per_rank[0]) == len(per_rank[1]) == 2
    assert results[0]["history"] == results[1]["history"] or all(  # same global metrics (timings aside)
        {k: v for k, v in a.items() if not k.startswith(TIMING_KEYS)} ==
        {k: v for k, v in b.items() if not k.startswith(TIMING_KEYS)}
        for a, b in zip(results[0]["history"], results[1]["history"]))
    for step, ((rounds0, trained0), (rounds1, trained1)) in enumerate(zip(*per_rank)):
        num_rounds = int(results[0]["history"][step]["filter_groups/num_gen_batches"])
        assert len(rounds0) == len(rounds1) == num_rounds  # the same number of generation rounds on each rank
        want = expected_rows([rounds0, rounds1], target=4, n=4)
        assert [trained0["tokens"], trained1["tokens"]] == want  # each rank trains its share of the picked groups
        for trained, first in ((trained0, 0), (trained1, 2)):
            assert len(trained["tokens"]) == 2 * 4  # exact: train_batch_size / dp prompts x n samples per rank
            assert CONSTANT not in trained["scores"]
            assert trained["group_index"] == [first] * 4 + [first + 1] * 4
    generated = [v for rank in per_rank for rounds, _ in rank for rnd in rounds for v in rnd["values"]]
    assert generated.count(CONSTANT) >= 8  # the constant groups were there to be filtered


def train_cli(out, *overrides: str) -> list[dict]:
    cli("rlhf_mcore.train", "--config", TINY_DAPO, "trainer.total_steps=3", "trainer.export_hf=false",
        f"trainer.output_dir={out}", "rollout.max_response_length=8", *overrides)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_resume_from_a_mid_run_checkpoint_is_bitwise(tmp_path):
    straight = train_cli(tmp_path / "a", "trainer.save_freq=1", "trainer.max_checkpoints_to_keep=3")
    steps = {m["step"]: m for m in straight if "filter_groups/num_gen_batches" in m}
    rounds = {s: int(m["filter_groups/num_gen_batches"]) for s, m in steps.items()}
    state = json.loads((tmp_path / "a" / "global_step_1" / "trainer_state.json").read_text())
    assert state["sampler"]["position"] == rounds[1]  # every prompt batch drawn, kept or not, is consumed
    assert max(rounds[2], rounds[3]) > 1  # the resumed steps drew extra batches (else this test proves little)
    resumed = train_cli(tmp_path / "b", f"trainer.resume={tmp_path / 'a' / 'global_step_1'}")
    for step in (2, 3):
        got = [m for m in resumed if m.get("step") == step and "filter_groups/num_gen_batches" in m][-1]
        compared = [k for k in steps[step] if not k.startswith(TIMING_KEYS)]
        assert len(compared) > 20 and {k: got.get(k) for k in compared} == {k: steps[step][k] for k in compared}
