"""tools/bench/bench_partial_tail.py's CPU dry run (the tiny model through the static decoder's eager steps): the
GPU command's code path at test size. Every variant trains whole batches; the synchronous one is never stale; the
partial ones carry samples and lag at most their bound; the ratios are to the synchronous run of the same launch."""
import json

from tests.launch import cli


def test_dry_run_reports_each_variant_against_sync(tmp_path):
    cli("tools.bench.bench_partial_tail", "--seconds", "2", "--variants", "sync,partial:1,partial:2,rounds:1",
        "--out", tmp_path, timeout=300)
    report = json.loads((tmp_path / "partial_tail_tiny.json").read_text())
    rows = {r["variant"]: r for r in report["results"]}
    assert sorted(rows) == ["partial_lag1", "partial_lag2", "rounds_lag1", "sync"]
    assert rows["sync"]["staleness_mean"] == 0 and rows["sync"]["rollout_tok_s_vs_sync"] == 1.0
    for name, lag in (("partial_lag1", 1), ("partial_lag2", 2), ("rounds_lag1", 1)):
        r = rows[name]
        assert r["steps"] >= 2 and r["trained_tokens_per_step"] > 0 and 0 < r["staleness_mean"] <= lag
        assert r["rollout_tok_s_vs_sync"] == r["rollout_tok_s"] / rows["sync"]["rollout_tok_s"]
        assert r["steps_per_min"] == 60.0 / (r["rollout_s_per_step"] + r["train_fwd_bwd_s"])
