"""Multi-turn tool rollouts of a vision LM at TP2 and PP2 (tests/cases/vlm_multi_turn.py): every tool result writes
image and video ids after the prompt, which each layout's rollout and trainer read as text. Two GRPO steps give the
1-rank run's turns, scores, losses and grad norm (PP2: measured bitwise; TP2: within fp32 reduction noise), and
every layout's rollout log-probs are its trainer's."""
import json

import pytest

from tests.launch import worker

pytestmark = pytest.mark.dist
COMPARED = ("num_turns/mean", "tool_calls/mean", "critic/score/mean", "response_length/mean", "actor/pg_loss",
            "actor/entropy", "actor/grad_norm")


def test_multi_turn_with_images_trains_alike_at_tp2_and_pp2(tmp_path):
    worker(1, ("vlm_multi_turn", tmp_path / "one.json", tmp_path), extra_env={"OMP_NUM_THREADS": "1"})
    worker(2, ("vlm_multi_turn", tmp_path / "pp2.json", tmp_path, "parallel.pp=2"),
           ("vlm_multi_turn", tmp_path / "tp2.json", tmp_path, "parallel.tp=2"), extra_env={"OMP_NUM_THREADS": "1"})
    runs = {name: json.loads((tmp_path / f"{name}.json").read_text()) for name in ("one", "pp2", "tp2")}
    assert all(len(steps) == 2 for steps in runs.values())
    assert all(m["num_turns/mean"] > 1 for m in runs["one"])  # tool turns with their image ids were taken
    for name, steps in runs.items():
        for m in steps:
            assert m["rollout/mismatch_logp_abs_diff"] < 1e-5, (name, m["rollout/mismatch_logp_abs_diff"])
    for layout in ("pp2", "tp2"):
        for base, other in zip(runs["one"], runs[layout]):
            for key in COMPARED:
                assert other[key] == pytest.approx(base[key], rel=1e-4, abs=1e-6), (layout, key)
