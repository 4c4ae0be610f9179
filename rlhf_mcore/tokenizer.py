"""One tokenizer interface over HF ``tokenizer.json`` directories and SentencePiece ``.model`` files.

``load_tokenizer(path)`` picks the backend from what lies at ``path`` and never downloads anything:

- a directory with ``tokenizer.json`` or ``tokenizer_config.json``: transformers ``AutoTokenizer``, offline;
- a ``.model`` file, or a directory holding only ``tokenizer.model``: SentencePiece.

``encode`` never adds special tokens: prompts go through ``apply_chat_template`` first, and a chat template
that wants a BOS token writes it into the text. ``pad_id`` falls back to ``eos_id``; a tokenizer without an
EOS token is rejected at load time, since generation could never stop.

Tokenizers without a chat template (every SentencePiece model, HF base models) use ``render_plain_chat``:
one ``"<Role>: <content>"`` block per message, blocks separated by a blank line, and ``"Assistant:"`` as the
generation prompt::

    System: You are terse.

    User: 2+2?

    Assistant:
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol, Sequence

Messages = Sequence[dict]
PLAIN_ROLES = {"system": "System", "user": "User", "assistant": "Assistant", "tool": "Tool"}


class Tokenizer(Protocol):
    eos_id: int
    pad_id: int  # eos_id when the tokenizer has no pad token
    bos_id: int | None
    vocab_size: int  # number of ids the tokenizer can produce (added tokens included)
    special_tokens: dict[str, int]  # added and special tokens by text (the chat template's end of turn is one)

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def apply_chat_template(self, messages: Messages, add_generation_prompt: bool = True) -> str: ...


def render_plain_chat(messages: Messages, add_generation_prompt: bool = True) -> str:
    """The fallback chat template (see the module docstring).

    >>> render_plain_chat([{"role": "user", "content": "Hi"}])
    'User: Hi\\n\\nAssistant:'
    >>> render_plain_chat([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}], False)
    'User: Hi\\n\\nAssistant: Yo'
    """
    blocks = []
    for k, msg in enumerate(messages):
        role, content = msg.get("role"), msg.get("content")
        if role not in PLAIN_ROLES or not isinstance(content, str):
            raise ValueError(
                f"message {k}: needs role in {sorted(PLAIN_ROLES)} and a string content (got {msg!r})"
            )
        blocks.append(f"{PLAIN_ROLES[role]}: {content}")
    if add_generation_prompt:
        blocks.append("Assistant:")
    return "\n\n".join(blocks)


class HFTokenizer:
    """transformers tokenizer loaded from a local directory."""

    def __init__(self, path: Path):
        from transformers import AutoTokenizer  # heavy import, only when an HF tokenizer is used

        self.path = path
        self.hf = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.eos_id = _require_eos(self.hf.eos_token_id, path)
        self.pad_id = self.hf.pad_token_id if self.hf.pad_token_id is not None else self.eos_id
        self.bos_id = self.hf.bos_token_id
        self.vocab_size = len(self.hf)
        specials = {t: self.hf.convert_tokens_to_ids(t) for t in self.hf.all_special_tokens}
        self.special_tokens = {**self.hf.get_added_vocab(), **specials}

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @property
    def supports_tools(self) -> bool:
        """The chat template renders a `tools=` list of function schemas itself (Qwen2.5, Qwen3, Llama-3.1)."""
        return "tools" in (self.hf.chat_template or "")

    def apply_chat_template(self, messages: Messages, add_generation_prompt: bool = True, tools=None) -> str:
        if not self.hf.chat_template:
            return render_plain_chat(messages, add_generation_prompt)
        extra = {"tools": tools} if tools else {}
        return self.hf.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt, **extra
        )


class SentencePieceTokenizer:
    """SentencePiece model file; chats use ``render_plain_chat``."""

    def __init__(self, path: Path):
        import sentencepiece

        self.path = path
        self.sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
        self.eos_id = _require_eos(self.sp.eos_id() if self.sp.eos_id() >= 0 else None, path)
        self.pad_id = self.sp.pad_id() if self.sp.pad_id() >= 0 else self.eos_id
        self.bos_id = self.sp.bos_id() if self.sp.bos_id() >= 0 else None
        self.vocab_size = self.sp.get_piece_size()
        self.special_tokens: dict[str, int] = {}  # chats use render_plain_chat: no end-of-turn token

    def encode(self, text: str) -> list[int]:
        return list(self.sp.encode(text, out_type=int))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        ids = [int(i) for i in ids]
        if skip_special_tokens:
            ids = [i for i in ids if not (self.sp.is_control(i) or self.sp.is_unknown(i))]
        return self.sp.decode(ids)

    def apply_chat_template(self, messages: Messages, add_generation_prompt: bool = True) -> str:
        return render_plain_chat(messages, add_generation_prompt)


def _require_eos(eos_id: int | None, path: Path) -> int:
    if eos_id is None:
        raise ValueError(
            f"tokenizer at '{path}' has no EOS token, so generation could never stop. "
            "Set eos_token in tokenizer_config.json (HF) or train the SentencePiece model with eos_id >= 0."
        )
    return int(eos_id)


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer at ``path`` (see the module docstring for what is accepted)."""
    path = Path(path)
    if path.is_file() and path.suffix == ".model":
        return SentencePieceTokenizer(path)
    if path.is_dir():
        if (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file():
            return HFTokenizer(path)
        if (path / "tokenizer.model").is_file():
            return SentencePieceTokenizer(path / "tokenizer.model")
    raise ValueError(
        f"no tokenizer at '{path}': expected a directory with tokenizer.json / tokenizer_config.json "
        "(HF) or a SentencePiece .model file."
    )
