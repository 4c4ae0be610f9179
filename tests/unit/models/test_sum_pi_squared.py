"""sum_v pi(v)^2 per token (optimal token baseline input) against full softmax logits."""
from types import SimpleNamespace

import torch

from rlhf_mcore.models.logprobs import token_logprobs, token_sum_pi_squared


class OneRank:
    def rank(self):
        return 0

    def size(self):
        return 1


def fake_model(weight: torch.Tensor, vocab: int):
    return SimpleNamespace(share_embeddings_and_output_weights=False, output_layer=SimpleNamespace(weight=weight),
                           vocab_size_unpadded=vocab)


def test_matches_full_softmax_with_temperature_and_padded_vocab():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 5, 8, generator=g, dtype=torch.float64)
    weight = torch.randn(13, 8, generator=g, dtype=torch.float64)  # 11 real rows + 2 padding rows
    tokens = torch.randint(0, 11, (2, 5), generator=g)
    model = fake_model(weight, 11)
    got = token_sum_pi_squared(model, hidden, tokens, OneRank(), temperature=0.7, chunk_size=3)
    probs = torch.softmax(hidden[:, :-1] @ weight[:11].t() / 0.7, -1)  # [2, 4, 11]
    torch.testing.assert_close(got[:, 1:], probs.square().sum(-1))
    assert torch.all(got[:, 0] == 0)
    logp, _ = token_logprobs(model, hidden, tokens, OneRank(), temperature=0.7)
    assert torch.all(got[:, 1:] >= logp[:, 1:].exp().square() - 1e-12)  # sum pi^2 >= pi(y)^2
