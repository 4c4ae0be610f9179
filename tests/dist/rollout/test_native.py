"""The native engine at every layout, three launches of the shared worker in all (~10-25 s each on 2 cores):

- world size 1 (plain python): KV-cache greedy == a naive no-cache loop; log-probs == a full forward;
  stop tokens / strings / max_new_tokens / n; micro-batching; padded vocab; modes, memory, registry.
- TP2, PP2, TP2xPP2 (torchrun + gloo): every rank returns the identical batch, equal to TP1's
  (tokens exactly, log-probs to 1e-5) for greedy, seeded sampling, and sampling with stop tokens.
- Multi-turn through the real native engine equals the same tokens fed to the trainer, at TP1 and TP2: the
  rollout's log-probs of the policy tokens are the trainer's forward's within the single-turn bound
  (tests/unit/rollout/test_logprob_agreement.py: 1e-3 at bf16), every row is its prompt + the sampled ids of
  each turn + the tool turns' ids exactly, later turns continue from those exact prefixes, and no tool-turn
  token has loss mask 1. At TP2 and PP2 every rank holds the same rows, and they are the TP1 rows token for
  token (tests/cases/multi_turn_native.py).
- An engine with its own copy of the model (SGLang's contract, a stand-in server on CPU) at TP2, PP2 and
  TP2xPP2 with 4 gloo ranks: the TP gather / PP broadcast of the actor's weights equals the converter's HF
  state dict of the full actor, bitwise and in order, for an untied Qwen2 (q/k/v biases) and a tied Llama;
  the bucketed refresh sends exactly those tensors; each DP replica's rows are split over all its ranks and
  every rank gets the replica's batch back in row order (tests/cases/engine_layouts.py).
"""
from __future__ import annotations

import json
import os

import pytest
import torch

from tests.launch import worker

ONE_THREAD = {"OMP_NUM_THREADS": "1"}
CHECKS = ["greedy_matches_naive_loop", "logprobs_match_full_forward", "layout_and_n", "stop_tokens_and_length",
          "stop_strings", "micro_batching", "vocab_padding_never_sampled", "ddp_wrapped_model",
          "modes_memory_registry", "static_decode_matches_eager"]
SCENARIOS = ["greedy", "sampled", "stopped"]
# label -> (ranks, TP, PP) of the native_rollout case
LAYOUTS = {"tp1": (1, 1, 1), "tp2": (2, 2, 1), "pp2": (2, 1, 2), "tp2xpp2": (4, 2, 2)}
# label -> (ranks, "tp" | "pp") of the multi_turn_native case
MULTI_TURN = {"tp1": (1, "tp"), "tp2": (2, "tp"), "pp2": (2, "pp")}
ENGINE_LAYOUTS = "2x1,1x2,2x2"  # engine_layouts, in the 4-rank launch


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """Every case of this file, one launch per world size (1 rank runs as plain python)."""
    work = tmp_path_factory.mktemp("native")
    for nproc in (1, 2, 4):
        runs = [("native_rollout", "--tp", tp, "--pp", pp, "--out", (work / label).mkdir() or work / label)
                for label, (n, tp, pp) in LAYOUTS.items() if n == nproc]
        runs += [("multi_turn_native", work / f"multi_turn_{label}.json", layout)
                 for label, (n, layout) in MULTI_TURN.items() if n == nproc]
        runs += [("engine_layouts", "--layouts", ENGINE_LAYOUTS, "--out", work / "engine")] if nproc == 4 else []
        worker(0 if nproc == 1 else nproc, *runs, extra_env=ONE_THREAD)
    return work


def batches_at(work, label: str) -> list[dict]:
    """Every rank's saved batches of one native_rollout layout."""
    return [torch.load(os.path.join(work / label, f"rank{r}.pt")) for r in range(LAYOUTS[label][0])]


@pytest.fixture(scope="module")
def reference(launched):
    with open(launched / "tp1" / "checks.json") as f:
        return batches_at(launched, "tp1")[0], json.load(f)


@pytest.fixture(scope="module")
def tp1(launched):
    return json.loads((launched / "multi_turn_tp1.json").read_text())


def test_checks_are_all_reported(reference):
    assert sorted(reference[1]) == sorted(CHECKS)


@pytest.mark.parametrize("check", CHECKS)
def test_single_rank(reference, check):
    result = reference[1][check]
    assert result == "ok", result


def assert_same_batch(got: dict, want: dict, where: str) -> None:
    for key in ("tokens", "prompt_lengths", "response_lengths"):
        assert torch.equal(got[key], want[key]), f"{where}: {key}\n{got[key]}\n!=\n{want[key]}"
    assert got["finish_reasons"] == want["finish_reasons"], where
    torch.testing.assert_close(got["rollout_logprobs"], want["rollout_logprobs"], atol=1e-5, rtol=0, msg=where)


@pytest.mark.parametrize("label", ["tp2", "pp2", "tp2xpp2"])
def test_layout_matches_tp1(reference, launched, label):
    _, tp, pp = LAYOUTS[label]
    ranks = batches_at(launched, label)
    for name in SCENARIOS:
        for r, batches in enumerate(ranks):
            assert_same_batch(batches[name], reference[0][name], f"tp{tp} pp{pp} rank {r} {name} vs tp1")
            for key in ("tokens", "rollout_logprobs"):  # replicas agree bit for bit
                assert torch.equal(batches[name][key], ranks[0][name][key]), f"rank {r} {name} {key} vs rank 0"


@pytest.mark.parametrize("layout,ranks", [("tp", 1), ("tp", 2), ("pp", 2)])
def test_multi_turn_native_rollout_is_the_trainers_tokens_and_log_probs(launched, tp1, layout, ranks):
    r = tp1 if ranks == 1 else json.loads((launched / f"multi_turn_{layout}{ranks}.json").read_text())
    assert (r["tp"], r["pp"]) == ((ranks, 1) if layout == "tp" else (1, ranks))
    assert r["num_turns"] == [3] * 8 and r["tool_calls"] == [2] * 8 and r["tool_errors"] == [0] * 8, r
    assert r["exact_rows"] and r["prefixes_exact"] and r["tool_mask"] == 0 and r["same_on_every_rank"], r
    assert r["multi_tokens"] == 8 * 24  # 10 + 10 + 4 sampled tokens per row (64-token budget, 20 per tool turn)
    assert r["tokens"] == tp1["tokens"]  # the same rows at every layout (same weights, same seeds)
    if layout == "tp":  # PP: the trainer's forward needs the pipeline schedule; the tokens say enough
        assert 0 < r["multi_gap"] < 1e-3 and 0 < r["single_gap"] < 1e-3, r  # bf16: a real gap, within the bound


def test_full_weights_and_row_split_at_tp2_pp2_and_tp2xpp2(launched):
    result = json.loads((launched / "engine" / "result.json").read_text())
    assert sorted(result) == sorted(f"{layout} {case}" for layout in ("2x1", "1x2", "2x2")
                                    for case in ("qwen2", "llama_tied"))
    assert {key: r["problems"] for key, r in result.items() if r["problems"]} == {}
    for key, r in result.items():  # 10 rows per replica: 5 + 5 over 2 model-parallel ranks, 3/3/2/2 over 4
        assert r["rows_per_rank"] == ([3, 3, 2, 2] if key.startswith("2x2") else [5, 5, 5, 5]), key
