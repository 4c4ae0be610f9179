"""actor.router_replay=R2 in GRPO on a tiny random HF Qwen3-MoE: the experts every router actually used in the
update's forwards equal those of the old-log-prob pass, token by token, though the update packs its
mini-batches differently (and, at EP2 under torchrun, exchanges tokens between the ranks); without replay the
second mini-batch's routing moves. The first mini-batch's ratio is the same with and without replay (1 to
1e-6). The moe/* load metrics count tokens x top-k x layers and agree at EP1 and EP2."""
import json

import pytest

from rlhf_mcore.config.load import load_config
from rlhf_mcore.trainer.loop import train
from tests.launch import worker
from tests.support.paths import ROOT_STR as ROOT
from tests.support.routing_capture import RoutingCapture
from tests.support.tiny_moe import EXPERTS, NUM_LAYERS, TOPK, save_tiny_moe

BLANK = [f"model.{k}=null" for k in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                                     "num_query_groups", "vocab_size")]


def overrides(hf_dir: str, out_dir, *extra: str) -> list[str]:
    """One GRPO step in two mini-batches (the old-log-prob pass runs), every pass packed (the update's bins are
    not the old pass's)."""
    return BLANK + [f"model.hf_path={hf_dir}", f"trainer.output_dir={out_dir}", "trainer.total_steps=1",
                    "trainer.save_freq=0", "trainer.resume=disable", "trainer.logger=[console]",
                    "trainer.export_hf=false", "actor.ppo_mini_batch_size=2", "data.use_sequence_packing=true",
                    *extra]


def check_load_metrics(m: dict) -> None:
    counts = [m[f"moe/tokens_per_expert/e{j}"] for j in range(EXPERTS)]
    assert sum(counts) == m["perf/total_num_tokens"] * TOPK * NUM_LAYERS
    assert 1.0 <= m["moe/expert_load_max_over_mean"] <= m["moe/expert_load_max_over_mean_max"] <= EXPERTS / TOPK


def test_update_replays_the_old_passes_experts(tmp_path, mcore_ctx, monkeypatch):
    hf_dir = save_tiny_moe(tmp_path / "hf")
    runs = {}
    for mode in ("R2", "disabled"):
        with monkeypatch.context() as patch:
            capture = RoutingCapture().install(patch)
            cfg = load_config(f"{ROOT}/configs/tiny_grpo.yaml",
                              overrides(hf_dir, tmp_path / mode, f"actor.router_replay={mode}"))
            runs[mode] = capture, train(cfg).history[-1]
    (replay, m_replay), (free, m_free) = runs["R2"], runs["disabled"]
    print({mode: {"mismatched_tokens_x_layers": c.mismatches(), "first_minibatch_ratio": c.first_ratio(),
                  **{k: m[k] for k in ("actor/ppo_kl", "actor/ratio_max", "actor/ratio_min",
                                       "moe/expert_load_max_over_mean")}} for mode, (c, m) in runs.items()})
    assert len(replay.update) == 2 and all(set(step) <= set(replay.old) for step in replay.update)
    assert sum(len(step) for step in replay.update) == len(replay.old) > 0
    assert replay.mismatches() == [0, 0]
    free_mismatch = free.mismatches()
    assert free_mismatch[1] > 0  # the first optimizer step moved the routers: the test can fail
    assert replay.first_ratio() == free.first_ratio()
    assert all(abs(r - 1.0) <= 1e-6 for r in replay.first_ratio())
    check_load_metrics(m_replay)
    check_load_metrics(m_free)


@pytest.mark.dist
def test_replay_and_load_metrics_at_ep1_and_ep2(tmp_path):
    """Two ranks (DP2), experts whole on each rank (EP1) or four per rank (EP2, tokens exchanged)."""
    hf_dir = save_tiny_moe(tmp_path / "hf")
    worker(2, *[("router_replay", tmp_path / f"ep{ep}.json",
                  *overrides(hf_dir, tmp_path / f"run_ep{ep}", "actor.router_replay=R2", f"parallel.ep={ep}"))
                 for ep in (1, 2)], extra_env={"OMP_NUM_THREADS": "1"}, timeout=900)  # one launch, both EP sizes
    results = {ep: json.loads((tmp_path / f"ep{ep}.json").read_text()) for ep in (1, 2)}
    print({ep: {k: v for k, v in r.items() if k != "metrics"} for ep, r in results.items()})
    for r in results.values():
        assert all(m == [0, 0] for m in r["mismatches"]) and all(n > 0 for n in r["rows"])
        check_load_metrics(r["metrics"])
    one, two = results[1]["metrics"], results[2]["metrics"]
    for key in [k for k in one if k.startswith("moe/")]:
        assert two[key] == pytest.approx(one[key], rel=1e-6), key
