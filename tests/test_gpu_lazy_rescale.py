"""GPU tests of softmax.lazy_rescale (a row's max kept until a tile's passes it by the plan's slack): a committed
spec with the key passes every case the verifier runs, e4m3 and 16-bit, and on keys whose scores rise along the
sequence (a row's max moves tile after tile, past the slack) its output stays within the error rule (16-bit) or
within twice the committed kernel's error (e4m3), both against an fp32 reference."""
from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import pytest

from attngen.eval.verify import attention_torch, exact_fp32_matmul
from test_gpu_fma_exp2 import cases_of
from test_gpu_fp8 import needs_sm90a
from test_gpu_runtime import assert_close_to_reference
from test_gpu_verify import load_once, torch  # noqa: F401 (torch: the fixture)
from test_lazy_rescale import lazy_trial

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
BASES = ("h100_wgmma_d128_fp8", "h100_wgmma_d64_persistent_q2")


@functools.lru_cache(maxsize=None)
def trial(base: str) -> Path:
    return lazy_trial(Path(tempfile.mkdtemp()), base)


@pytest.mark.parametrize("base", BASES)
def test_a_spec_with_a_kept_max_passes_every_case(base):
    needs_sm90a(ROOT / "specs" / f"{base}.yaml")
    kernel = load_once(trial(base))
    assert kernel.plan.fragments.lazy_slack > 0
    results = [check(4000 + i, kernel.name) for i, check in enumerate(cases_of(kernel))]
    assert results and all(r.passed for r in results), "\n".join(
        f"{r.variant} {r.shape.label}: {'; '.join(r.problems)}" for r in results if not r.passed)


def rising(torch, d: int, seqlen: int, dtype):
    """q, k, v (1, 2, seqlen, d) whose scores drift along the keys: key j's first column gains 0.05 j, and each
    query's first column is 1 + N(0, 1), so most rows' max climbs about 18 log2 units over 2048 keys (past either
    slack, tile after tile) and the rest fall."""
    g = torch.Generator(device="cuda").manual_seed(9)
    q, k, v = (torch.randn(1, 2, seqlen, d, generator=g, device="cuda") for _ in range(3))
    q[..., 0] += 1.0
    k[..., 0] += 0.05 * torch.arange(seqlen, device="cuda")
    return q.to(dtype), k.to(dtype), v.to(dtype)


@pytest.mark.parametrize("causal", [False, True])
def test_rising_maxima_16bit(torch, causal):
    base = "h100_wgmma_d64_persistent_q2"
    needs_sm90a(ROOT / "specs" / f"{base}.yaml")
    q, k, v = rising(torch, 64, 2048, torch.float16)
    out = load_once(trial(base))(q, k, v, causal=causal)
    assert_close_to_reference(torch, out, q, k, v, causal=causal)


@pytest.mark.parametrize("causal", [False, True])
def test_rising_maxima_e4m3(torch, causal):
    """P at up to 2^8.75 through e4m3 (its largest value 448): the kept max's error at most twice the committed
    kernel's, whose P reaches 2^8, against the fp32 attention of the same e4m3 inputs."""
    base = "h100_wgmma_d128_fp8"
    needs_sm90a(ROOT / "specs" / f"{base}.yaml")
    q, k, v = rising(torch, 128, 2048, torch.float32)
    q8, k8, v8 = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
    v_t = v8.transpose(-1, -2).contiguous()
    with exact_fp32_matmul(torch):
        ref, _ = attention_torch(q8.float(), k8.float(), v8.float(), scale=128 ** -0.5, causal=causal)
    errors = {}
    for name, path in (("committed", ROOT / "specs" / f"{base}.yaml"), ("lazy", trial(base))):
        out = load_once(path)(q8, k8, v_t, causal=causal)
        assert torch.isfinite(out).all()
        errors[name] = (out.float() - ref).abs().max().item()
    assert errors["lazy"] <= 2 * errors["committed"] + 1e-3, errors
