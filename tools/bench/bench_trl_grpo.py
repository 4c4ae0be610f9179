"""TRL's GRPOTrainer at the shape of bench_grpo_step.py: the denominator of our step-time ratio.

    python -m tools.bench.bench_trl_grpo --out results/     # one H200 (TRL, datasets carried as wheels)
    python -m tools.bench.bench_trl_grpo --tiny              # CPU dry run

Random Qwen2.5-0.5B-shaped `Qwen2ForCausalLM` (transformers, bf16, SDPA), HF `generate` (no vLLM),
beta=0 (no reference model), 64 prompts x 8 generations x 256 new tokens (min_new_tokens=256: no early
EOS), 128-token prompts, one optimizer step per generation batch (per-device batch x accumulation = 512,
steps_per_generation = accumulation, one iteration: TRL then skips its old-log-prob pass, as we do).
The tokenizer is a word-level one over "t3".."t{V-1}" (`word_tokenizer`), so a prompt of 128 words is 128
tokens.
Step time = wall time between optimizer steps (a callback, CUDA synchronised); generation time wraps
TRL's `_generate_single_turn`. Writes OUT/grpo_step_part_trl.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--micro-batch", type=int, default=32, help="per_device_train_batch_size")
    p.add_argument("--steps", type=int, default=3, help="timed optimizer steps (after one warm-up step)")
    p.add_argument("--out", default="")
    return p.parse_args(argv)


def word_tokenizer(vocab: int):
    """A word a token: "t3".."t{V-1}" are ids 3..V-1, split on spaces; "<pad>" 0, "<eos>" 1 and a newline 2 (verl's
    agent loop checks that a Qwen tokenizer encodes one as one token). Prompts draw ids from 10, so 128 words are
    128 tokens. (Before 2026-12-04 pad and EOS were the words "t0" and "t1": special tokens match inside words, so
    "t17" was "t1" + "7" and a 128-word prompt was about 177 tokens.) The chat template is the bare text."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Split
    from transformers import PreTrainedTokenizerFast

    words = {"<pad>": 0, "<eos>": 1, "\n": 2, **{f"t{i}": i for i in range(3, vocab)}}
    tok = Tokenizer(WordLevel(words, unk_token="<pad>"))
    tok.pre_tokenizer = Split(" ", behavior="removed")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<pad>",
                                   padding_side="left")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    return fast


def qwen_model(tiny: bool, dtype):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=300) if tiny else \
        dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
             num_key_value_heads=2, vocab_size=151936)
    cfg = Qwen2Config(**shape, tie_word_embeddings=True, max_position_embeddings=4096, rope_theta=1e6,
                      bos_token_id=None, eos_token_id=1, pad_token_id=0)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).to(dtype), shape["vocab_size"]


class StepClock:
    """TrainerCallback: wall seconds between optimizer steps (synchronised)."""

    def __init__(self):
        from transformers import TrainerCallback

        clock = self

        class _Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                if clock.last is None:
                    clock.sync()
                    clock.last = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                clock.sync()
                now = time.perf_counter()
                clock.steps.append(now - clock.last)
                clock.last = now
        self.callback, self.steps, self.last = _Callback(), [], None

    @staticmethod
    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()


def timed_generation(trainer, gen_times: list) -> None:
    inner = trainer._generate_single_turn

    def wrapped(*args, **kwargs):
        StepClock.sync()
        start = time.perf_counter()
        out = inner(*args, **kwargs)
        StepClock.sync()
        gen_times.append(time.perf_counter() - start)
        return out
    trainer._generate_single_turn = wrapped


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.tiny:
        args.prompts, args.n, args.prompt_len, args.new_tokens, args.micro_batch, args.steps = 4, 2, 12, 8, 4, 2
    import datasets
    import trl
    from trl import GRPOConfig, GRPOTrainer

    cuda = torch.cuda.is_available()
    model, vocab = qwen_model(args.tiny, torch.bfloat16 if cuda else torch.float32)
    g = torch.Generator().manual_seed(0)
    num = args.prompts * (args.steps + 2)
    rows = torch.randint(10, vocab, (num, args.prompt_len), generator=g).tolist()
    prompts = [" ".join(f"t{i}" for i in row) for row in rows]
    rows = args.prompts * args.n
    accumulation = rows // args.micro_batch
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=accumulation, steps_per_generation=accumulation, num_generations=args.n,
        max_completion_length=args.new_tokens, generation_kwargs={"min_new_tokens": args.new_tokens},
        temperature=1.0, beta=0.0, num_iterations=1, learning_rate=1e-6, bf16=cuda, use_cpu=not cuda,
        max_steps=args.steps + 1, logging_steps=1, save_strategy="no", report_to=[], seed=1,
        gradient_checkpointing=False, shuffle_dataset=False, dataloader_num_workers=0)
    reward = lambda completions, **kw: torch.rand(len(completions)).tolist()  # noqa: E731
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, processing_class=word_tokenizer(vocab),
                          train_dataset=datasets.Dataset.from_dict({"prompt": prompts}))
    clock, gen_times = StepClock(), []
    trainer.add_callback(clock.callback)
    timed_generation(trainer, gen_times)
    trainer.train()
    steps, gens = clock.steps[1:], gen_times[1:]  # the first step warms up
    step_s, gen_s = statistics.median(steps), statistics.median(gens) if gens else None
    result = {"system": f"trl-{trl.__version__}", "engine": "hf-generate", "step_s": step_s, "steps_s": steps,
              "phases_s": {"gen": gen_s, "train": step_s - gen_s if gen_s else None, "step": step_s},
              "tokens_per_s": rows * (args.prompt_len + args.new_tokens) / step_s,
              "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
              "shape": {"prompts": args.prompts, "n": args.n, "prompt_len": args.prompt_len,
                        "new_tokens": args.new_tokens, "micro_batch": args.micro_batch, "tiny": args.tiny},
              "versions": {"trl": trl.__version__, "transformers": __import__("transformers").__version__,
                           "torch": torch.__version__},
              "device": torch.cuda.get_device_name() if cuda else "cpu"}
    print(f"TRL {trl.__version__}: step {step_s:.3f} s (steps {[round(s, 3) for s in steps]}), generation "
          f"{gen_s if gen_s is None else round(gen_s, 3)} s, peak {result['peak_mem_gib']} GiB")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        path = Path(args.out) / f"grpo_step_part_trl{'_tiny' if args.tiny else ''}.json"
        path.write_text(json.dumps(result, indent=2))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
