"""A multi-turn rollout through the real native engine equals the same tokens fed to the trainer, at TP1 and
TP2 (gloo): the rollout's log-probs of the policy tokens are the trainer's forward's within the single-turn
bound (tests/unit/rollout/test_logprob_agreement.py: 1e-3 at bf16), every row is its prompt + the sampled ids of
each turn + the tool turns' ids exactly, later turns continue from those exact prefixes, and no tool-turn
token has loss mask 1. At TP2 and PP2 every rank holds the same rows, and they are the TP1 rows token for
token. Worker: tests/cases/multi_turn_native.py (~15 s per layout on 2 cores)."""
import json
import os
import subprocess
import sys

import pytest

from tests.support.ports import free_port

from tests.support.paths import ROOT_STR as ROOT
pytestmark = pytest.mark.dist


def rollout_at(tmp_path, layout: str, ranks: int) -> dict:
    out = tmp_path / f"result_{layout}{ranks}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
           "-m", "tests.cases.multi_turn_native", str(out), layout]
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", MASTER_PORT=str(free_port()))
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def tp1(tmp_path_factory):
    return rollout_at(tmp_path_factory.mktemp("tp1"), "tp", 1)


@pytest.mark.parametrize("layout,ranks", [("tp", 1), ("tp", 2), ("pp", 2)])
def test_multi_turn_native_rollout_is_the_trainers_tokens_and_log_probs(tmp_path, tp1, layout, ranks):
    r = tp1 if ranks == 1 else rollout_at(tmp_path, layout, ranks)
    assert (r["tp"], r["pp"]) == ((ranks, 1) if layout == "tp" else (1, ranks))
    assert r["num_turns"] == [3] * 8 and r["tool_calls"] == [2] * 8 and r["tool_errors"] == [0] * 8, r
    assert r["exact_rows"] and r["prefixes_exact"] and r["tool_mask"] == 0 and r["same_on_every_rank"], r
    assert r["multi_tokens"] == 8 * 24  # 10 + 10 + 4 sampled tokens per row (64-token budget, 20 per tool turn)
    assert r["tokens"] == tp1["tokens"]  # the same rows at every layout (same weights, same seeds)
    if layout == "tp":  # PP: the trainer's forward needs the pipeline schedule; the tokens say enough
        assert 0 < r["multi_gap"] < 1e-3 and 0 < r["single_gap"] < 1e-3, r  # bf16: a real gap, within the bound
