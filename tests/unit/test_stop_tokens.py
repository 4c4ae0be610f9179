"""The stop set from one place (rlhf_mcore/stop_tokens.py, trainer/inputs.stop_token_ids): a list eos in
generation_config.json, config.json's eos, a tokenizer that disagrees with the config (one warning naming
both, the union used), the chat template's end-of-turn token (ChatML, Llama-3), never the pad token."""
import json
import logging
from types import SimpleNamespace

import pytest

from rlhf_mcore.stop_tokens import end_of_turn_token
from rlhf_mcore.tokenizer import load_tokenizer
from rlhf_mcore.trainer.inputs import stop_token_ids

WORDS = "the answer is 42 so we stop here".split()
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA3 = ("<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
          "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
          "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
PLAIN = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def save_tokenizer(path, specials: list[str], template: str | None = None, **special_tokens):
    """A word-level HF tokenizer whose ids 0.. are `specials`, then WORDS; special_tokens: eos_token=...."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(specials + ["<unk>"] + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", additional_special_tokens=specials,
                                 **special_tokens)
    if template:
        hf.chat_template = template
    hf.save_pretrained(path)
    return path


def model_dir(path, config_eos=None, generation_eos=None):
    path.mkdir(parents=True, exist_ok=True)
    if config_eos is not None:
        (path / "config.json").write_text(json.dumps({"model_type": "llama", "eos_token_id": config_eos}))
    if generation_eos is not None:
        (path / "generation_config.json").write_text(json.dumps({"eos_token_id": generation_eos}))
    return path


def run_cfg(hf_path) -> SimpleNamespace:
    return SimpleNamespace(model=SimpleNamespace(hf_path=str(hf_path)))


def test_list_eos_in_generation_config_and_config_eos(tmp_path):
    """Llama-3-Instruct: generation_config lists three ids; every one stops, the tokenizer's first."""
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved|>", "<|eot_id|>", "<|start_header_id|>",
                "<|end_header_id|>"]
    path = save_tokenizer(model_dir(tmp_path, config_eos=1, generation_eos=[1, 2, 3]), specials, LLAMA3,
                          eos_token="<|eot_id|>", bos_token="<|begin_of_text|>")
    assert stop_token_ids(run_cfg(path), load_tokenizer(path)) == (3, 1, 2)
    alone = model_dir(tmp_path / "int", config_eos=[4, 1], generation_eos=5)  # config.json's own list counts too
    assert stop_token_ids(run_cfg(alone), load_tokenizer(path)) == (3, 5, 4, 1)


def test_tokenizer_that_disagrees_with_the_config_warns_once_and_stops_at_the_union(tmp_path, caplog):
    """As transformers 5.17 exported SmolLM2: tokenizer eos <|im_start|> (1), config eos <|im_end|> (2)."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    path = save_tokenizer(model_dir(tmp_path, config_eos=2, generation_eos=2), specials, CHATML,
                          eos_token="<|im_start|>")
    tokenizer = load_tokenizer(path)
    with caplog.at_level(logging.INFO, logger="rlhf_mcore.trainer.inputs"):
        assert stop_token_ids(run_cfg(path), tokenizer, announce=True) == (1, 2)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "its eos is 1 '<|im_start|>'" in warnings[0] and "says 2 '<|im_end|>'" in warnings[0]
    assert "union [1, 2]" in warnings[0]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert infos == ["stop tokens: 1 '<|im_start|>', 2 '<|im_end|>' (any of them ends a response)"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="rlhf_mcore.trainer.inputs"):
        stop_token_ids(run_cfg(path), tokenizer)  # not announced (ranks other than 0): silent
    assert not caplog.records


@pytest.mark.parametrize("template, end", [(CHATML, "<|im_end|>"), (LLAMA3, "<|eot_id|>"), (PLAIN, None)],
                         ids=["chatml", "llama3", "plain"])
def test_chat_template_end_of_turn_joins_the_set(tmp_path, template, end):
    """A base tokenizer (eos <|endoftext|>) with an instruct chat template and no config files: the token the
    template writes after each assistant message stops a response too; a plain-text template adds none."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
                "<|end_header_id|>", "<|eot_id|>"]
    path = save_tokenizer(tmp_path / "tok", specials, template, eos_token="<|endoftext|>")
    tokenizer = load_tokenizer(path)
    want = (0,) if end is None else (0, specials.index(end))
    assert stop_token_ids(run_cfg(""), tokenizer) == want


def test_pad_token_is_not_a_stop_token(tmp_path):
    """A pad token of its own never ends a response; a pad that equals eos is in the set as the eos."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
    path = save_tokenizer(model_dir(tmp_path, config_eos=2), specials, CHATML, eos_token="<|im_end|>",
                          pad_token="<|pad|>")
    tokenizer = load_tokenizer(path)
    assert tokenizer.pad_id == 3 and stop_token_ids(run_cfg(path), tokenizer) == (2,)


def test_end_of_turn_needs_the_same_token_after_every_assistant_message():
    """A template whose last assistant message ends differently from the earlier ones has no end-of-turn."""
    odd = lambda msgs: "".join(f"<u>{m['content']}" if m["role"] == "user" else  # noqa: E731
                               f"{m['content']}{'<end>' if k < len(msgs) - 1 else '<last>'}"
                               for k, m in enumerate(msgs))
    assert end_of_turn_token(odd, {"<end>": 5, "<last>": 6, "<u>": 7}) is None
    refuses = lambda msgs: (_ for _ in ()).throw(ValueError("no system turn"))  # noqa: E731
    assert end_of_turn_token(refuses, {"<end>": 5}) is None
