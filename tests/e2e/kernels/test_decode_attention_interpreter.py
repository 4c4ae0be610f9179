"""The decode-attention Triton kernels under triton's CPU interpreter (a process of its own: TRITON_INTERPRET
is read at import)."""
import pytest

from tests.launch import cli

_INTERPRETED = """
import torch
from rlhf_mcore.kernels.decode_attention import reference_decode_attention, triton_decode_attention
from tests.unit.kernels.test_decode_attention import _case
for dtype in (torch.float32, torch.float16):  # the interpreter's bf16 tl.dot is wrong: bf16 runs on the GPU
    for pos, splits in ((37, 1), (37, 3), (49, 4), (0, 2)):
        q, k, v, key_valid, p = _case(pos=pos, dtype=dtype)
        key_valid[:, 0] = True
        want = reference_decode_attention(q, k, v, key_valid, p, 0.25)
        got = triton_decode_attention(q, k, v, key_valid, p, 0.25, splits=splits)
        tol = 1e-5 if dtype == torch.float32 else 2e-3
        torch.testing.assert_close(got, want, atol=tol, rtol=0)
    rows = torch.tensor([37, 0, 49])  # per-row positions, no key_valid (the static decoder's call)
    for splits in (1, 3):
        want = reference_decode_attention(q, k, v, None, rows, 0.25)
        torch.testing.assert_close(triton_decode_attention(q, k, v, None, rows, 0.25, splits=splits), want,
                                   atol=tol, rtol=0)
print("ok")
"""


def test_kernels_under_the_triton_interpreter():
    """Unsplit and split-KV (with empty splits) against the reference, run by triton's CPU interpreter."""
    pytest.importorskip("triton")
    run = cli("-c", _INTERPRETED, extra_env={"TRITON_INTERPRET": "1"}, check=False)
    assert run.returncode == 0 and "ok" in run.stdout, run.stderr[-3000:]
