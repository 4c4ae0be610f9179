"""Qwen3-MoE at every layout of the issue's list (gloo, CPU): `tools.convert_checkpoint hf-to-mcore --ep` then
`verify` (fp32 logits against transformers within 1e-4) at EP2, TP2, PP2 (2 ranks) and TP2xEP2, PP2xEP2 (4 ranks),
each checkpoint also verified after resharding from the 1x1 one; `mcore-to-hf` of an EP2 checkpoint gives the
input HF tensors bitwise; Mixtral at EP2, TP2 and PP2. Plus the layout rules checked before any model is built
(expert TP, SP at tp > 1)."""
import os
import subprocess
import sys

import pytest

from tests.models.test_qwen3_moe import tiny_moe
from tests.tools.tiny_hf import ROOT, diff_state_dicts, load_tensors, parse_verify_lines

ENV = dict(os.environ, OMP_NUM_THREADS="1")


def convert_and_verify(work, nproc: int, layouts: str, case: str = "qwen3_moe") -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--standalone",
           "-m", "tests.tools.convert_worker", "--work", str(work), "--layouts", layouts, "--cases", case]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=ENV)
    rows = parse_verify_lines(proc.stdout)
    for row in rows:
        print(" ".join(f"{k}={v}" for k, v in row.items()))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return rows


def round_trip(work, layout: str, case: str = "qwen3_moe") -> list[str]:
    """mcore-to-hf (one process: megatron reshards the EP checkpoint to 1x1) against the source HF tensors."""
    out = work / f"back_{case}_{layout}"
    cmd = [sys.executable, "-m", "tools.convert_checkpoint", "mcore-to-hf", "--mcore-dir",
           str(work / "mcore" / f"{case}_{layout}"), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return diff_state_dicts(load_tensors(work / "hf" / case), load_tensors(out))


def layouts_of(rows: list[dict], case: str = "qwen3_moe") -> list[tuple[str, str, str, str]]:
    return [(r["ckpt"].removeprefix(f"{case}_"), r["tp"], r["pp"], r["ep"]) for r in rows]


@pytest.mark.dist
def test_logits_at_ep2_tp2_pp2_and_ep2_round_trip_bitwise(tmp_path):
    tiny_moe(False).save_pretrained(str(tmp_path / "hf" / "qwen3_moe"))
    rows = convert_and_verify(tmp_path, 2, "1x1,1x1x2,2x1,1x2")
    assert layouts_of(rows) == [("1x1", "1", "1", "1"), ("1x1x2", "1", "1", "2"), ("1x1", "1", "1", "2"),
                                ("2x1", "2", "1", "1"), ("1x1", "2", "1", "1"), ("1x2", "1", "2", "1"),
                                ("1x1", "1", "2", "1")]
    assert all(r["passed"] and float(r["logits_max"]) <= 1e-4 for r in rows)
    assert round_trip(tmp_path, "1x1x2") == []


@pytest.mark.dist
def test_logits_at_tp2xep2_and_pp2xep2_and_round_trip_bitwise(tmp_path):
    """Four ranks. TP2xEP2 (experts whole, parallel.etp=1): the EP group is the TP pair, which therefore holds
    four different experts each and the same attention shards."""
    tiny_moe(True).save_pretrained(str(tmp_path / "hf" / "qwen3_moe"))
    rows = convert_and_verify(tmp_path, 4, "1x1,2x1x2,1x2x2")
    assert layouts_of(rows) == [("1x1", "1", "1", "1"), ("2x1x2", "2", "1", "2"), ("1x1", "2", "1", "2"),
                                ("1x2x2", "1", "2", "2"), ("1x1", "1", "2", "2")]
    assert all(r["passed"] and float(r["logits_max"]) <= 1e-4 for r in rows)
    assert round_trip(tmp_path, "2x1x2") == []


@pytest.mark.dist
def test_mixtral_logits_at_ep2_and_round_trip_bitwise(tmp_path):
    """Mixtral (block_sparse_moe w1/w3/w2): `hf-to-mcore` at EP2, TP2 and PP2, each verified (and the 1x1
    checkpoint resharded to it) against transformers; the EP2 checkpoint back to HF bitwise."""
    from tests.models.test_qwen3_moe import tiny_mixtral

    tiny_mixtral().save_pretrained(str(tmp_path / "hf" / "mixtral"))
    rows = convert_and_verify(tmp_path, 2, "1x1,1x1x2,2x1,1x2", "mixtral")
    assert layouts_of(rows, "mixtral") == [("1x1", "1", "1", "1"), ("1x1x2", "1", "1", "2"), ("1x1", "1", "1", "2"),
                                           ("2x1", "2", "1", "1"), ("1x1", "2", "1", "1"), ("1x2", "1", "2", "1"),
                                           ("1x1", "1", "2", "1")]
    assert all(r["passed"] and float(r["logits_max"]) <= 1e-4 for r in rows)
    assert round_trip(tmp_path, "1x1x2", "mixtral") == []


def test_expert_tp_and_sequence_parallel_rules_before_build(tmp_path):
    from rlhf_mcore.config.load import ConfigError, load_config

    tiny = os.path.join(ROOT, "configs", "tiny_grpo.yaml")
    tiny_moe(True).config.to_json_file(str(tmp_path / "config.json"))
    moe = [f"model.{k}=null" for k in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                                       "num_query_groups", "vocab_size")] + [f"model.hf_path={tmp_path}"]
    with pytest.raises(ConfigError) as info:
        load_config(tiny, moe + ["parallel.etp=2", "parallel.tp=2"], world_size=2)
    assert "parallel.etp: expert tensor parallelism is not supported (got 2); experts are never split over TP. " \
           "Set parallel.etp=1 and split the experts with parallel.ep." in info.value.errors
    with pytest.raises(ConfigError) as info:
        load_config(tiny, moe + ["parallel.tp=2", "rollout.engine=sglang"], world_size=2)
    assert [e for e in info.value.errors if e.startswith("parallel.sequence_parallel")] == [
        "parallel.sequence_parallel: an MoE model at tp > 1 needs sequence parallelism (got false with tp=2). Set "
        "parallel.sequence_parallel=true, or split the experts with parallel.ep at tp=1."]
    cfg = load_config(tiny, moe + ["actor_rollout_ref.actor.megatron.expert_model_parallel_size=2"], world_size=2)
    assert cfg.parallel.ep == 2 and cfg.parallel.etp == 1
