"""The loss functions' metrics are reduced like the loss (`trainer/metrics.py`): the same update reports the
same numbers at micro-batch 1, 2, 4, packed, dynamic, at 1 and 2 DP ranks, and at TP2 / PP2 (gloo, fp32, to
1e-6)."""
import json

import pytest

from tests.launch import worker

pytestmark = pytest.mark.dist
TOL = 1e-6


# name -> (ranks, TP, PP); DP = ranks / (TP x PP)
PARALLEL = {"dp1": (1, 1, 1), "dp2": (2, 1, 1), "tp2": (2, 2, 1), "pp2": (2, 1, 2)}


def deviations(runs: dict[str, dict]) -> dict[str, tuple[float, str]]:
    """{metric: (largest |x - ref| / max(1, |ref|) over the runs, the run)}, ref = the first run."""
    (ref_name, ref), *rest = runs.items()
    worst = {}
    for name, metrics in rest:
        assert set(metrics) == set(ref), (name, set(metrics) ^ set(ref))
        for key, value in metrics.items():
            dev = abs(value - ref[key]) / max(1.0, abs(ref[key]))
            if dev >= worst.get(key, (-1.0, ""))[0]:
                worst[key] = (dev, f"{name} vs {ref_name}")
    return worst


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every row of PARALLEL, one launch per world size (the shared worker's metrics_invariance case)."""
    tmp = tmp_path_factory.mktemp("metrics")
    for nproc in sorted({n for n, _, _ in PARALLEL.values()}):
        worker(nproc, *[("metrics_invariance", tmp / f"metrics_{name}.json", tp, pp)
                        for name, (n, tp, pp) in PARALLEL.items() if n == nproc], timeout=900)
    return {name: json.loads((tmp / f"metrics_{name}.json").read_text()) for name in PARALLEL}


@pytest.mark.parametrize("recipe", ["grpo", "ppo"])
def test_metrics_do_not_depend_on_micro_batches_packing_or_layout(results, recipe):
    runs = {f"{name} {layout}": m for name in PARALLEL for layout, m in results[name][recipe].items()}
    worst = deviations(runs)
    expected = {"actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/ratio_mean", "actor/ratio_max",
                "actor/ratio_min", "actor/entropy", "actor/kl_loss", "actor/loss", "actor/grad_norm",
                "rollout/mismatch_kl_k1", "rollout/mismatch_first_abs_diff", "rollout/is_weight_max"}
    if recipe == "ppo":
        expected |= {"critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/loss"}
    assert expected <= set(worst), expected - set(worst)
    bad = {k: v for k, v in worst.items() if v[0] > TOL}
    assert not bad, "metrics differ between layouts: " + "; ".join(
        f"{k}: {dev:.2e} ({where})" for k, (dev, where) in sorted(bad.items()))
