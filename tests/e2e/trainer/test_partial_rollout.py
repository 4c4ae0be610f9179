"""Partial rollouts from the command line, as a verl user writes them: the tiny GRPO preset with verl's
`async_training.partial_rollout=true async_training.staleness_threshold=1` runs and logs the staleness metrics,
and a run resumed from a checkpoint written while samples were in flight ends with the metrics of the run that
went on (both drop what is in flight at the save)."""
import json
from pathlib import Path

import pytest

from tests.launch import cli
from tests.support.paths import CONFIGS
from tests.support.reliability import TIMING_KEYS

VERL = ("async_training.partial_rollout=true", "async_training.staleness_threshold=1")


def train(out: Path, *overrides: str) -> list[dict]:
    cli("rlhf_mcore.train", "--config", CONFIGS / "tiny_grpo.yaml", "trainer.total_steps=4", "trainer.export_hf=false",
        f"trainer.output_dir={out}", *VERL, *overrides, log=out.with_suffix(".log"))
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# the two ways to decode the pool: rounds (megatron's eager cache on a CPU), and continuous batching (the static
# decoder, run on the CPU with eager steps)
DECODE = {"rounds": (), "continuous": ("rollout.native.static_on_cpu=true",)}
LOG_LINE = {"rounds": "rounds of 4 tokens", "continuous": "continuous batching (finished samples' slots are refilled"}


@pytest.mark.parametrize("decode", sorted(DECODE))
def test_verl_keys_run_and_log_staleness(tmp_path, decode):
    rows = train(tmp_path / "run", "trainer.save_freq=0", *DECODE[decode])
    assert [m["step"] for m in rows if "actor/pg_loss" in m] == [1, 2, 3, 4]
    assert {m["async/staleness_max"] for m in rows} == {0.0, 1.0}  # carried batches train one version late
    assert all(m["async/staleness_max"] <= 1 and m["async/samples_dropped_total"] == 0 for m in rows)
    log = (tmp_path / "run.log").read_text()
    assert f"rollout: partial rollouts (async_training): {LOG_LINE[decode]}" in log
    assert "samples may lag 1 version(s)" in log


@pytest.mark.parametrize("decode", sorted(DECODE))
def test_resume_across_a_save_with_samples_in_flight_is_bitwise(tmp_path, decode):
    straight = train(tmp_path / "a", "trainer.save_freq=1", "trainer.max_checkpoints_to_keep=4", *DECODE[decode])
    assert straight[0]["async/samples_carried_total"] > 0  # step 1's save dropped samples in flight
    assert straight[1]["async/samples_dropped_at_save_total"] == straight[0]["async/samples_carried_total"]
    resumed = train(tmp_path / "b", f"trainer.resume={tmp_path / 'a' / 'global_step_2'}", "trainer.save_freq=1",
                    *DECODE[decode])
    assert [m["step"] for m in resumed if "actor/pg_loss" in m] == [3, 4]
    for want, got in zip(straight[2:], [m for m in resumed if "actor/pg_loss" in m]):
        # the count of what the save dropped is the one number that differs: the resumed run had nothing in flight
        keys = [k for k in want if not k.startswith(TIMING_KEYS) and k != "async/samples_dropped_at_save_total"]
        assert len(keys) > 20 and {k: got.get(k) for k in keys} == {k: want[k] for k in keys}


def test_dynamic_sampling_composes_with_partial_rollouts(tmp_path):
    """DAPO's dynamic sampling (algorithm.filter_groups) on top of partial rollouts: each generation round of a step
    is a partial rollout of its own (complete groups, carried samples), and the step fills its batch from them."""
    out = tmp_path / "run"
    cli("rlhf_mcore.train", "--config", CONFIGS / "tiny_dapo.yaml", "trainer.total_steps=3", "trainer.export_hf=false",
        f"trainer.output_dir={out}", "trainer.save_freq=0", *VERL, log=out.with_suffix(".log"))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in rows if "actor/pg_loss" in m]
    assert [m["step"] for m in steps] == [1, 2, 3]
    for m in steps:
        assert m["filter_groups/num_gen_batches"] >= 1 and m["async/staleness_max"] <= 1
        assert m["filter_groups/num_kept"] >= 4  # data.train_batch_size groups whose rewards differ
    assert any(m["async/samples_carried_total"] > 0 for m in steps)
    assert any(m["filter_groups/num_gen_batches"] > 1 for m in steps)  # a step drew a second partial rollout
