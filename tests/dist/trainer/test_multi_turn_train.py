"""rollout.mode=multi_turn through the whole trainer, in process on one rank: configs/tiny_tool_grpo.yaml
with a scripted tool-call parser (every assistant turn calls the calculator: the tiny random model writes no
`<tool_call>` of its own) runs tool turns end to end (start-up line, step line and JSONL name the mode, turns
and tool calls; response length counts policy tokens only), and a resume from a mid-run checkpoint is bitwise
the straight run, as for single-turn (tests/dist/trainer/test_dynamic_sampling_dist.py)."""
from __future__ import annotations

import json
import random
import re
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

import rlhf_mcore.rollout.modes.build as build_mod
from rlhf_mcore.agent.executor import ToolExecutor
from rlhf_mcore.agent.parsers import ToolCall
from rlhf_mcore.config.load import load_config
from rlhf_mcore.trainer.loop import train

from tests.support.paths import ROOT
PRESET = str(ROOT / "configs" / "tiny_tool_grpo.yaml")
TIMING_KEYS = ("timing", "perf/", "mem")


def calls_every_turn(text: str) -> list:
    """A scripted parser: each turn is one calculator call whose expression depends on the turn's text."""
    return [ToolCall("calculator", {"expression": f"{len(text)}*3"})]


@pytest.fixture()
def scripted_calls(monkeypatch):
    """The parser, and as its "end of a call" stop strings every letter and digit: turns of a few tokens."""
    stops = tuple("abcdefghijklmnopqrstuvwxyz0123456789")
    monkeypatch.setattr(build_mod, "parser_fn", lambda name: (calls_every_turn, stops))


def preset(out: Path, *overrides: str):
    base = [f"data.train_files={ROOT / 'data/tiny/train.parquet'}", "data.val_files=",
            f"reward.custom_fn={ROOT / 'data/tiny/reward.py'}:vowel_fraction", f"trainer.output_dir={out}",
            "trainer.export_hf=false", "trainer.resume=disable", "rollout.max_response_length=40",
            "rollout.n=2", "data.train_batch_size=2"]
    return load_config(PRESET, base + list(overrides), world_size=1)


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def counts_policy_tokens_only(m: dict, rows: int = 4) -> bool:
    """response_length counts policy tokens: within the 40-token budget, and fewer than the responses hold with
    their tool turns (perf/total_num_tokens less the prompts) once a turn has followed a tool turn."""
    with_tools = m["perf/total_num_tokens"] - m["prompt_length/mean"] * rows
    return m["response_length/max"] <= 40 and m["response_length/mean"] * rows < with_tools


def test_tiny_tool_preset_runs_tool_turns_through_the_trainer(tmp_path, mcore_ctx, scripted_calls, capsys):
    train(preset(tmp_path / "run", "trainer.total_steps=2", "trainer.save_freq=0"))
    out = capsys.readouterr().out
    assert "rollout: multi_turn mode (native engine; up to 3 assistant turns" in out
    lines = re.findall(r"step \d/2 .*", out)
    assert len(lines) == 2
    for line in lines:
        turns, tools = map(float, re.search(r"multi_turn: turns ([\d.]+) \(max \d\) tools ([\d.]+)", line).groups())
        assert turns > 1 and tools > 0, line
    for m in records(tmp_path / "run"):
        assert 1 < m["num_turns/mean"] <= m["num_turns/max"] <= 3 and m["num_turns/min"] >= 1
        # a call ends every turn but the last (whose call ran, but its result did not fit the budget, if any)
        assert m["num_turns/mean"] - 1 <= m["tool_calls/mean"] <= m["num_turns/mean"]
        assert m["tool/call_rate"] > 0 and m["tool/error_rate"] == 0 and m["tool/timeout_rate"] == 0  # "N*3" is valid
        assert counts_policy_tokens_only(m) and m["rollout/mismatch_logp_abs_diff"] < 1e-4, m


def test_multi_turn_resume_from_a_mid_run_checkpoint_is_bitwise(tmp_path, mcore_ctx, scripted_calls):
    steps = ("trainer.total_steps=2", "trainer.save_freq=1", "trainer.max_checkpoints_to_keep=2")
    train(preset(tmp_path / "a", *steps))
    straight = {m["step"]: m for m in records(tmp_path / "a")}
    assert all(straight[s]["tool_calls/mean"] > 0 for s in (1, 2))
    train(preset(tmp_path / "b", *steps, f"trainer.resume={tmp_path / 'a' / 'global_step_1'}"))
    resumed = {m["step"]: m for m in records(tmp_path / "b")}
    for step in (2,):
        compared = [k for k in straight[step] if not k.startswith(TIMING_KEYS)]
        assert len(compared) > 20 and "num_turns/mean" in compared
        assert {k: resumed[step].get(k) for k in compared} == {k: straight[step][k] for k in compared}, step


def timed_calls(monkeypatch, delay_s: float | None) -> None:
    """None: each tool call runs when it is made (its future is done at once), so a continuous decode sees every
    result at its next poll and the run does not depend on thread timing. Else each call sleeps U(0, delay_s) on
    the executor's threads first: samples come back while others decode, in an order set by the threads."""
    if delay_s is None:
        def submit(self, call, tools_kwargs=None):
            done = Future()
            done.set_result(self.run_one(call, tools_kwargs))
            return done
        monkeypatch.setattr(ToolExecutor, "submit", submit)
        return
    run_one, draws = ToolExecutor.run_one, random.Random(0)

    def slow(self, *args):
        time.sleep(draws.uniform(0, delay_s))
        return run_one(self, *args)
    monkeypatch.setattr(ToolExecutor, "run_one", slow)


@pytest.mark.parametrize("decode,delay_s", [("rounds", None), ("continuous", None), ("continuous", 0.1)])
def test_partial_rollouts_carry_multi_turn_samples_through_the_trainer(tmp_path, mcore_ctx, scripted_calls,
                                                                       monkeypatch, decode, delay_s):
    """verl's async keys on the tool preset: samples carried across steps with their tool turns, in rounds and in
    continuous batching (the static decoder on the CPU), train a version late with the tool counts logged. With
    slow tools (the order samples rejoin in then depends on thread timing) every step still gets its groups, no
    token lags more than one version, and nothing is dropped."""
    timed_calls(monkeypatch, delay_s)
    extra = ("rollout.native.static_on_cpu=true",) if decode == "continuous" else ()
    train(preset(tmp_path / "run", "trainer.total_steps=3", "trainer.save_freq=0",
                 "async_training.partial_rollout=true", "async_training.staleness_threshold=1", *extra))
    rows = records(tmp_path / "run")
    assert [m["step"] for m in rows] == [1, 2, 3]
    assert all(m["async/staleness_max"] <= 1 for m in rows)
    assert delay_s is not None or any(m["async/staleness_max"] == 1.0 for m in rows)  # seeded: carried samples train
    for m in rows:
        assert m["num_turns/mean"] > 1 and m["tool_calls/mean"] > 0 and m["tool/error_rate"] == 0, m
        assert m["async/samples_dropped_total"] == 0 and counts_policy_tokens_only(m), m


@pytest.mark.dist
def test_multi_turn_at_dp2_with_forced_tool_calls(tmp_path):
    """Two DP replicas, each running its own turns (tools.bench.multi_turn_forced: every turn ending at a newline
    is a calculator call): the run finishes (no replica waits on another's extra turns) with tool turns logged."""
    from tests.launch import torchrun

    out = tmp_path / "run"
    torchrun("tools.bench.multi_turn_forced", 2, "--config", PRESET, f"trainer.output_dir={out}",
             "trainer.resume=disable", "trainer.export_hf=false", "trainer.total_steps=1", "trainer.save_freq=0",
             "data.val_files=", "trainer.logger=[jsonl]", "rollout.max_response_length=96",
             "rollout.multi_turn.max_turns=4", extra_env={"OMP_NUM_THREADS": "1"})
    steps = records(out)
    assert len(steps) == 1 and steps[0]["num_turns/max"] >= 2, steps
    assert all(m["tool_calls/mean"] > 0 and m["tool/error_rate"] == 0 for m in steps), steps


@pytest.fixture()
def long_vlm(tmp_path):
    """data/tiny_vlm with room for the tool schema (904 byte-level tokens) in its prompts: 2048 positions."""
    from tests.cases.vlm_multi_turn import long_vlm

    return long_vlm(tmp_path)


@pytest.mark.parametrize("decode", ["eager", "static"])
def test_a_vision_lms_tool_turns_keep_its_images_and_read_image_ids_from_tools_as_text(
        tmp_path, mcore_ctx, scripted_calls, long_vlm, monkeypatch, decode):
    """rollout.mode=multi_turn on the tiny VLM (configs/tiny_vlm_grpo.yaml), every turn a tool call whose result
    writes `<|image_pad|><|video_pad|>` (image and video ids after the prompt): each later turn prefills the prompt's
    image again and reads those ids as text, as the trainer reads every token past the prompt, so the rollout's
    log-probs are the trainer's (fp32), eager or through the static decoder (its GPU path, run on the CPU). The images
    go with the batch to the trainer."""
    from rlhf_mcore.agent.executor import ToolResult

    monkeypatch.setattr(ToolExecutor, "run_one", lambda self, *a: ToolResult("<|image_pad|><|video_pad|>7", None,
                                                                             False, 0.0))
    from tests.cases.vlm_multi_turn import OVERRIDES

    cfg = load_config(str(ROOT / "configs" / "tiny_vlm_grpo.yaml"), [
        f"model.hf_path={long_vlm}", f"trainer.output_dir={tmp_path / 'run'}", *OVERRIDES,
        f"rollout.native.static_on_cpu={decode == 'static'}"], world_size=1)
    train(cfg)
    for m in records(tmp_path / "run"):
        assert m["num_turns/mean"] > 1 and m["tool_calls/mean"] > 0, m
        assert m["rollout/mismatch_logp_abs_diff"] < 1e-5 and m["rollout/mismatch_exact_frac"] > 0.9, m
