"""Step statistics (masked, one host copy) against hand computations, and the fixed-format step line."""
from types import SimpleNamespace

import pytest
import torch

from rlhf_mcore.trainer.step_log import _stats, format_step_line, step_metrics, to_floats


def test_masked_stats_by_hand():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[0, 1, 1], [1, 0, 0]])  # picks 2, 3, 4
    got = to_floats(_stats("a", values, mask))
    assert got == pytest.approx({"a/mean": 3.0, "a/std": (2 / 3) ** 0.5, "a/max": 4.0, "a/min": 2.0})
    assert to_floats(_stats("b", values, torch.zeros_like(mask))) == {"b/mean": 0.0, "b/std": 0.0, "b/max": 0.0,
                                                                      "b/min": 0.0}


def test_step_line_has_the_same_fields_every_step():
    line = format_step_line(3, 10, {"critic/score/mean": 0.5, "actor/pg_loss": -0.01, "timing_s/gen": 1.25})
    assert line.startswith("step 3/10 | reward 0.500 ± - | pg -0.0100 vf - kl - ent - clip - gnorm - | "
                           "len - max - cut - tok/s - mem -")
    assert line.endswith("| gen 1.2s")
    graded = format_step_line(3, 10, {"critic/score/mean": 0.5, "critic/acc/mean": 0.25, "critic/format/mean": 1.0})
    assert graded.startswith("step 3/10 | reward 0.500 ± - acc 0.250 fmt 1.000 | pg - ")  # a reward that reports them


def test_response_length_clip_ratio_and_phase_timings():
    ctx = SimpleNamespace(dims=SimpleNamespace(dp=1, world_size=1))
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    batch = {"token_level_scores": torch.zeros(4, 4), "token_level_rewards": torch.zeros(4, 4), "response_mask": mask,
             "response_lengths": torch.tensor([4, 2, 4, 1]), "prompt_lengths": torch.tensor([3, 3, 3, 3]),
             "advantages": torch.zeros(4, 4), "returns": torch.zeros(4, 4)}
    m = step_metrics(batch, {}, {}, {"old_log_prob": 1.0, "ref": 0.5}, ctx, max_response_length=4)
    assert m["response_length/clip_ratio"] == 0.5  # two of four responses hit the maximum length (verl)
    assert m["timing_s/ref"] == 0.5
    assert "ref 0.5s" in format_step_line(1, 1, m)


@pytest.mark.parametrize("sinks, printed", [(["console", "jsonl"], True), (["jsonl"], False)])
def test_step_line_printed_only_with_the_console_sink(sinks, printed, caplog):
    from rlhf_mcore.trainer.run import Run

    written = []
    run = SimpleNamespace(history=[], total_steps=10, ctx=SimpleNamespace(is_logging_rank=True),
                          cfg=SimpleNamespace(trainer=SimpleNamespace(logger=sinks)),
                          metric_logger=SimpleNamespace(write=lambda step, m: written.append(step)))
    run.console = Run.console.fget(run)
    with caplog.at_level("INFO", logger="rlhf_mcore"):
        Run.log_step(run, 3, {"critic/score/mean": 0.5})
    assert any(r.getMessage().startswith("step 3/10") for r in caplog.records) == printed
    assert written == [3] and run.history == [{"critic/score/mean": 0.5}]  # the sinks get the step either way
