"""The data tests' tokenizer: one id per character, so expected ids can be written by hand."""
import pytest


class CharTokenizer:
    """One id per character; the template is 'role: content' lines plus '>' as the generation prompt."""

    eos_id = pad_id = 0
    bos_id = None
    vocab_size = 256

    def apply_chat_template(self, messages, add_generation_prompt=True):
        text = "".join(f"{m['role'][0]}:{m['content']}\n" for m in messages)
        return text + (">" if add_generation_prompt else "")

    def encode(self, text):
        return [ord(c) % 256 for c in text]


@pytest.fixture
def tokenizer():
    return CharTokenizer()
