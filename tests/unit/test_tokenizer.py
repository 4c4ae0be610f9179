"""Tokenizer interface on a tiny SentencePiece model and a tiny HF tokenizer, both built here offline."""
import pytest

from rlhf_mcore.tokenizer import load_tokenizer, render_plain_chat

TEXT = [
    "Natalia sold clips to 48 of her friends in April.",
    "Then she sold half as many clips in May.",
    "How many clips did Natalia sell altogether in April and May?",
    "Weng earns 12 dollars an hour for babysitting.",
    "Yesterday she did 50 minutes of babysitting. How much did she earn?",
    "Let's think step by step and output the final answer after ####.",
    "The answer is 72 because 48 + 24 = 72.",
] * 4

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "How many clips?"}]
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _train_sentencepiece(tmp_path, **kw):
    import sentencepiece as spm

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXT))
    prefix = tmp_path / "sp"
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(prefix), vocab_size=100, model_type="bpe",
        character_coverage=1.0, minloglevel=2, **kw,
    )
    return prefix.with_suffix(".model")


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory):
    return _train_sentencepiece(tmp_path_factory.mktemp("sp"))


def _save_hf(tmp_path, chat_template=None, eos_token="</s>"):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = ["<unk>", "<s>", "</s>", "<|user|>", "<|system|>", "<|assistant|>"]
    tok.train_from_iterator(TEXT, trainers.WordLevelTrainer(special_tokens=specials))
    kwargs = {"eos_token": eos_token, "bos_token": "<s>", "unk_token": "<unk>"}
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, **{k: v for k, v in kwargs.items() if v})
    if chat_template:
        hf.chat_template = chat_template
    hf.save_pretrained(tmp_path)
    return tmp_path, tok


def test_sentencepiece(sp_model):
    tok = load_tokenizer(sp_model)
    assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (100, 1, 2)
    assert tok.pad_id == tok.eos_id  # no pad piece: falls back to eos
    ids = tok.encode("Natalia sold 48 clips")
    assert ids and all(0 <= i < 100 for i in ids) and tok.bos_id not in ids  # no special tokens added
    assert tok.decode(ids) == "Natalia sold 48 clips"
    assert tok.decode([tok.bos_id, *ids, tok.eos_id]) == "Natalia sold 48 clips"  # specials skipped
    assert tok.apply_chat_template(CHAT) == "System: Be brief.\n\nUser: How many clips?\n\nAssistant:"


def test_sentencepiece_directory_and_pad(tmp_path):
    model = _train_sentencepiece(tmp_path, pad_id=3, bos_id=-1)
    model.rename(tmp_path / "tokenizer.model")
    tok = load_tokenizer(tmp_path)
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (3, None, 2)


def test_sentencepiece_without_eos_is_rejected(tmp_path):
    model = _train_sentencepiece(tmp_path, eos_id=-1)
    with pytest.raises(ValueError, match="has no EOS token"):
        load_tokenizer(model)


def test_hf_with_chat_template(tmp_path):
    path, raw = _save_hf(tmp_path, chat_template=TEMPLATE)
    tok = load_tokenizer(path)
    assert tok.eos_id == raw.token_to_id("</s>") == 2
    assert tok.bos_id == 1 and tok.pad_id == 2  # no pad token: eos
    assert tok.vocab_size == raw.get_vocab_size()
    ids = tok.encode("Natalia sold 48 clips")
    assert ids == [raw.token_to_id(w) for w in ["Natalia", "sold", "48", "clips"]]
    assert tok.decode(ids) == "Natalia sold 48 clips"
    text = tok.apply_chat_template(CHAT)
    assert text == "<|system|>Be brief.</s><|user|>How many clips?</s><|assistant|>"
    assert tok.apply_chat_template(CHAT, add_generation_prompt=False).endswith("clips?</s>")
    ids = tok.encode(text)  # the special tokens of the template text map to their own ids
    assert (ids[0], ids[-1]) == (raw.token_to_id("<|system|>"), raw.token_to_id("<|assistant|>"))
    assert ids[-4:-2] == [raw.token_to_id("clips"), raw.token_to_id("?")]


def test_hf_without_template_uses_plain_fallback(tmp_path):
    tok = load_tokenizer(_save_hf(tmp_path)[0])
    assert tok.apply_chat_template(CHAT, add_generation_prompt=False) == "System: Be brief.\n\nUser: How many clips?"


def test_hf_without_eos_is_rejected(tmp_path):
    path, _ = _save_hf(tmp_path, eos_token=None)
    with pytest.raises(ValueError, match="has no EOS token"):
        load_tokenizer(path)


def test_nothing_at_path(tmp_path):
    with pytest.raises(ValueError, match="no tokenizer at"):
        load_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="no tokenizer at"):
        load_tokenizer(tmp_path / "missing.model")


def test_plain_chat_rejects_bad_messages():
    with pytest.raises(ValueError, match="message 1: needs role"):
        render_plain_chat([{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}])
    with pytest.raises(ValueError, match="message 0: needs role"):
        render_plain_chat([{"role": "user", "content": None}])
