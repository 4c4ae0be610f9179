"""A byte-level tokenizer for tiny test and demo models built from configs (no files needed).

Ids 0-255 are the UTF-8 bytes, 256 is EOS, 257 is PAD; `model.tokenizer: bytes` selects it.

>>> tok = ByteTokenizer()
>>> tok.encode("hi"), tok.decode([104, 105, 256])
([104, 105], 'hi')
>>> tok.apply_chat_template([{"role": "user", "content": "2+2?"}])
'user: 2+2?\\nassistant:'
"""
from __future__ import annotations


class ByteTokenizer:
    vocab_size = 258
    eos_id = 256
    pad_id = 257
    bos_id = None
    special_tokens: dict = {}  # no chat-template end-of-turn token

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        text = "\n".join(f"{m['role']}: {m['content']}" for m in messages)
        return text + ("\nassistant:" if add_generation_prompt else "")
