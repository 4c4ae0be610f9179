"""Full weights of an MoE model at expert parallelism (models/full_weights.py) and its HF export (gloo, CPU).

A tiny HF Qwen3-MoE is loaded at TPxEP layouts and its weights moved by name-seeded noise (the same at every
layout, so they are not the HF ones). At each layout `FullWeights` (what the SGLang weight sync reads) gives
every rank the same HF tensors, bitwise those of the 1x1 layout; the layout's dist-checkpoint exported by
`rlhf_mcore.convert.export` (the trainer's HF export) holds exactly those tensors, loads with transformers,
and gives the logits our model gave at that layout (fp32, within 1e-4) and those of the 1x1 layout."""
import re

import pytest
import torch

from tests.launch import cli, worker
from tests.support.tiny_hf import load_tensors
from tests.support.tiny_moe import tiny_moe

ENV = {"OMP_NUM_THREADS": "1"}
pytestmark = pytest.mark.dist


def run_worker(work, nproc: int, layouts: str) -> None:
    proc = worker(nproc, ("moe_full_weights", "--hf-dir", work / "hf", "--work", work, "--layouts", layouts),
                  extra_env=ENV, check=False)
    assert proc.returncode == 0, "\n".join(re.findall(r"PROBLEM .*", proc.stdout)) + proc.stderr[-6000:]


def export(work, layout: str):
    model_cfg = f'{{"hf_path": "{work / "hf"}", "dtype": "fp32", "attention_backend": "sdpa"}}'
    out = work / f"export_{layout}"
    cli("rlhf_mcore.convert.export", "--ckpt", work / f"ckpt_{layout}", "--out", out, "--model-config", model_cfg,
        extra_env=ENV)
    return out


def check_export(work, layout: str) -> tuple[float, float]:
    """(max |transformers on the export - ours at the layout|, max |ours at the layout - ours at 1x1|)."""
    from transformers import AutoModelForCausalLM

    out, full = export(work, layout), torch.load(work / f"full_{layout}.pt")
    exported = load_tensors(out)
    assert set(exported) == set(full) and all(torch.equal(exported[k], full[k]) for k in full)
    ours, ref = torch.load(work / f"logits_{layout}.pt"), torch.load(work / "logits_1x1.pt")
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = hf(ours["tokens"]).logits
    return (theirs - ours["logits"]).abs().max().item(), (ours["logits"] - ref["logits"]).abs().max().item()


def same_full_weights(work, layout: str) -> bool:
    ref, full = torch.load(work / "full_1x1.pt"), torch.load(work / f"full_{layout}.pt")
    return list(full) == list(ref) and all(torch.equal(full[k], ref[k]) for k in ref)


def test_full_weights_and_hf_export_at_ep2_tp2_and_ep_over_tp(tmp_path):
    tiny_moe(False).save_pretrained(str(tmp_path / "hf"))
    run_worker(tmp_path, 2, "1x1,1x2,2x1,2x2")  # 2x2: the expert group is the TP pair (dp 1)
    assert all(same_full_weights(tmp_path, layout) for layout in ("1x2", "2x1", "2x2"))
    for layout in ("1x1", "1x2", "2x2"):
        vs_hf, vs_ep1 = check_export(tmp_path, layout)
        print(f"moe export {layout} (TPxEP): logits max |transformers - ours| = {vs_hf:.2e}, |ours - ours 1x1| = "
              f"{vs_ep1:.2e}")
        assert vs_hf <= 1e-4 and vs_ep1 <= 1e-4


def test_full_weights_and_hf_export_at_tp2xep2(tmp_path):
    tiny_moe(True).save_pretrained(str(tmp_path / "hf"))
    run_worker(tmp_path, 4, "1x1,2x2")
    assert same_full_weights(tmp_path, "2x2")
    vs_hf, vs_ep1 = check_export(tmp_path, "2x2")
    print(f"moe export 2x2 (TPxEP): logits max |transformers - ours| = {vs_hf:.2e}, |ours - ours 1x1| = {vs_ep1:.2e}")
    assert vs_hf <= 1e-4 and vs_ep1 <= 1e-4
