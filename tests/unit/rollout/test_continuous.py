"""Continuous batching in the native engine (`rlhf_mcore.rollout.continuous`), on the static decoder's eager steps:
refilled slots decode what a synchronous call decodes, a stopped call's cut rows continue from their exact prefix,
and every row ends at its own limit, stop token or stop string."""
import pytest
import torch

from rlhf_mcore.models.build import build_model
from rlhf_mcore.models.transformer_config import load_hf_config
from rlhf_mcore.rollout.native import NativeRolloutEngine, unwrap_model
from rlhf_mcore.rollout.types import SamplingParams
from tests.support.tiny import tiny_model_config


@pytest.fixture(scope="module")
def engine(mcore_ctx):
    cfg = tiny_model_config(num_layers=2, dtype="fp32", vocab_size=200)
    model = unwrap_model(build_model("actor", load_hf_config(cfg.model), cfg.model, cfg.parallel, mcore_ctx)).eval()
    engine = NativeRolloutEngine(model, mcore_ctx, pad_id=0, static_on_cpu=True)
    assert engine.continuous and not engine.static.use_graphs
    return engine


def _prompts(count: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 200, (int(n),), generator=g).tolist() for n in torch.randint(2, 12, (count,), generator=g)]


def _sync(engine, rows, max_new, **kw):
    """Each row alone through the synchronous static path: (tokens, log-probs, finish reason) per row."""
    out = []
    for row in rows:
        b = engine.generate([row], SamplingParams(n=1, max_new_tokens=max_new, temperature=0.0, **kw))
        start, n = int(b.prompt_lengths[0]), int(b.response_lengths[0])
        out.append((b.tokens[0, start:start + n].tolist(), b.rollout_logprobs[0, start:start + n], b.finish_reasons[0]))
    return out


def _run(engine, rows, limits, slots, stop_after=None, **kw):
    ended = {}

    def on_finish(i, response):
        ended[i] = response
        return stop_after is not None and len(ended) >= stop_after
    cut = engine.generate_continuous(rows, limits, SamplingParams(n=1, max_new_tokens=max(limits), temperature=0.0,
                                                                  **kw), on_finish, num_slots=slots)
    return ended, cut


def test_refilled_slots_decode_what_a_synchronous_call_does(engine):
    """11 rows through 4 slots with limits 3..12: every slot is refilled several times; each row's greedy tokens
    equal its synchronous decode cut at its limit, log-probs to fp32 noise; the finish reason is 'length'."""
    rows = _prompts(11)
    limits = [3 + (i * 5) % 10 for i in range(11)]
    ended, cut = _run(engine, rows, limits, slots=4)
    assert cut == {} and sorted(ended) == list(range(11))
    for i, (tokens, logprobs, _) in enumerate(_sync(engine, rows, 12)):
        assert ended[i].tokens == tokens[:limits[i]], i
        torch.testing.assert_close(torch.tensor(ended[i].logprobs), logprobs[:limits[i]], atol=1e-5, rtol=0)
        assert ended[i].finish_reason == "length"


def test_stop_tokens_end_rows_and_free_their_slots(engine):
    rows = _prompts(9, seed=1)
    free = _sync(engine, rows, 10)
    stop = tuple({free[0][0][2], free[3][0][4]})  # tokens that end some rows early
    want = _sync(engine, rows, 10, stop_token_ids=stop)
    ended, _ = _run(engine, rows, [10] * 9, slots=3, stop_token_ids=stop)
    assert [ended[i].tokens for i in range(9)] == [w[0] for w in want]
    assert [ended[i].finish_reason for i in range(9)] == [w[2] for w in want]
    assert "stop" in {w[2] for w in want} and "length" in {w[2] for w in want}


def test_stop_strings_end_rows(engine):
    """A decode that maps every id to one letter: the stop string 'xy' ends the rows whose tokens spell it."""
    rows = _prompts(6, seed=2)
    engine.decode = lambda ids: "".join("xy"[t % 2] for t in ids)
    try:
        want = _sync(engine, rows, 8, stop_strings=("xy",))
        ended, _ = _run(engine, rows, [8] * 6, slots=2, stop_strings=("xy",))
    finally:
        engine.decode = None
    assert [ended[i].tokens for i in range(6)] == [w[0] for w in want]
    assert [ended[i].finish_reason for i in range(6)] == [w[2] for w in want]
    assert "stop" in {w[2] for w in want}


def test_a_stopped_call_cuts_rows_that_continue_from_their_exact_prefix(engine):
    """on_finish stops the call after 3 rows: the rows still decoding come back cut ('abort', a prefix of their
    full decode, log-probs too); rows never started do not. Continuing the cut rows from prompt + prefix with the
    rest of their budget gives the full decode."""
    rows = _prompts(10, seed=3)
    limits = [4 + 3 * (i % 4) for i in range(10)]
    ended, cut = _run(engine, rows, limits, slots=4, stop_after=3)
    assert len(ended) == 3 and cut and not set(cut) & set(ended)
    full = _sync(engine, rows, 13)
    for i, response in cut.items():
        assert response.finish_reason == "abort" and 0 < len(response.tokens) < limits[i]
        assert response.tokens == full[i][0][:len(response.tokens)]
        torch.testing.assert_close(torch.tensor(response.logprobs), full[i][1][:len(response.tokens)], atol=1e-5,
                                   rtol=0)
    assert len(ended) + len(cut) < 10, "rows still queued at the stop are neither ended nor cut"
    again, _ = _run(engine, [rows[i] + cut[i].tokens for i in cut], [limits[i] - len(cut[i].tokens) for i in cut],
                    slots=2)
    for j, i in enumerate(cut):
        assert cut[i].tokens + again[j].tokens == full[i][0][:limits[i]]


class Later:
    """A feed (`continuous.Feed`): `rows` join one at a time, the next each time a row has ended; a poll that
    blocks (no slot decoding) gets the next at once. Records which blocked."""

    def __init__(self, rows, limits, ended: dict):
        self.rows, self.limits, self.ended, self.given, self.blocked = rows, limits, ended, 0, []
        self.bounds = (max(len(r) + m for r, m in zip(rows, limits)), max(limits))

    def waiting(self) -> bool:
        return self.given < len(self.rows)

    def poll(self, block: bool):
        self.blocked.append(block)
        if self.given < len(self.rows) and (block or len(self.ended) > self.given):
            self.given += 1
            return [(self.rows[self.given - 1], self.limits[self.given - 1])], False
        return [], False


def test_rows_fed_mid_call_decode_what_a_synchronous_call_does(engine):
    """3 rows start in 2 slots; 5 more join from a feed as rows end (multi-turn samples back from their tools),
    reusing the response buffers of ended rows; one joins while no slot decodes (the poll blocks). Each fed row
    decodes its synchronous greedy tokens; rows are numbered in the order fed."""
    rows, more = _prompts(3, seed=4), _prompts(5, seed=5)
    limits, more_limits = [2, 9, 3], [5, 1, 7, 4, 6]
    ended = {}

    def on_finish(i, response):
        ended[i] = response
        return False
    feed = Later(more, more_limits, ended)
    cut = engine.generate_continuous(rows, limits, SamplingParams(n=1, max_new_tokens=9, temperature=0.0), on_finish,
                                     num_slots=2, feed=feed)
    assert cut == {} and sorted(ended) == list(range(8)) and feed.given == 5 and True in feed.blocked
    for i, (tokens, logprobs, _) in enumerate(_sync(engine, rows + more, 9)):
        want = (limits + more_limits)[i]
        assert ended[i].tokens == tokens[:want], i
        torch.testing.assert_close(torch.tensor(ended[i].logprobs), logprobs[:want], atol=1e-5, rtol=0)


def test_needs_the_static_decoder(mcore_ctx):
    cfg = tiny_model_config(num_layers=1)
    model = build_model("actor", load_hf_config(cfg.model), cfg.model, cfg.parallel, mcore_ctx)
    engine = NativeRolloutEngine(model, mcore_ctx, pad_id=0)
    if engine.static is not None:
        pytest.skip("a GPU: the static decoder runs")
    assert not engine.continuous
    with pytest.raises(RuntimeError, match="continuous batching needs the static decoder"):
        engine.generate_continuous([[1, 2]], [3], SamplingParams(n=1, max_new_tokens=3), lambda i, r: False, 1)


@pytest.mark.gpu
def test_graphed_continuous_decodes_what_the_graphed_synchronous_call_does(mcore_ctx):
    """On a GPU, through the captured decode graphs: 40 rows through 16 slots with ragged limits, stop tokens among
    them; each row's greedy tokens equal its synchronous graphed decode (fp32; log-probs to 1e-4: other batch
    buckets sum in other orders)."""
    cfg = tiny_model_config(hidden_size=128, ffn_hidden_size=256, num_layers=3, vocab_size=1000, dtype="fp32")
    model = build_model("actor", load_hf_config(cfg.model), cfg.model, cfg.parallel, mcore_ctx)
    engine = NativeRolloutEngine(model, mcore_ctx, pad_id=0)
    assert engine.continuous and engine.static.use_graphs
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(1, 1000, (int(n),), generator=g).tolist() for n in torch.randint(3, 30, (40,), generator=g)]
    limits = [4 + (i * 7) % 29 for i in range(40)]
    plain = _sync(engine, rows, 32)
    stop = tuple({plain[1][0][3], plain[7][0][10]})
    want = _sync(engine, rows, 32, stop_token_ids=stop)
    ended, cut = _run(engine, rows, limits, slots=16, stop_token_ids=stop)
    assert cut == {}
    for i, (tokens, logprobs, reason) in enumerate(want):
        n = min(len(tokens), limits[i])
        assert ended[i].tokens == tokens[:n], i
        assert ended[i].finish_reason == (reason if len(tokens) <= limits[i] and reason == "stop" else "length")
        torch.testing.assert_close(torch.tensor(ended[i].logprobs, device=logprobs.device), logprobs[:n], atol=1e-4,
                                   rtol=0)
