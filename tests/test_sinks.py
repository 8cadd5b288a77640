"""Learned attention sinks (gpt-oss): head h's logit joins every row's softmax denominator as a key
with no value. The forward kinds that take them add it where a row finishes (templates/variants/
sink.j2); the fp32 reference appends it as an extra column (core/variants.py extra_logits). The
GPU tests check kernel and reference against a third, written-out computation."""
from __future__ import annotations

from pathlib import Path

import pytest

from attngen.errors import SpecError
from attngen.render import render_spec_file
from attngen.spec import parse_spec

ROOT = Path(__file__).resolve().parent.parent
SINK_SPECS = ("h100_wgmma_d64_sink", "h100_mma_d64_sink")


def spec_text(name: str) -> str:
    return (ROOT / "specs" / f"{name}.yaml").read_text()


@pytest.mark.parametrize("name", SINK_SPECS)
def test_the_finish_of_each_row_adds_the_sink(name):
    source = render_spec_file(ROOT / "specs" / f"{name}.yaml").parts[0].source
    assert "p.sinks[c.head]" in source and "float* sinks;" in source


def test_a_spec_without_sinks_has_none_of_it():
    source = render_spec_file(ROOT / "specs" / "h100_wgmma_d64_window.yaml").parts[0].source
    assert "sinks" not in source


def test_a_kind_without_sinks_refuses_them():
    text = spec_text("h200_decode_d128_softcap").replace("scores: [softcap]", "scores: [sink]")
    with pytest.raises(SpecError) as e:
        parse_spec(text, file="decode.yaml")
    assert "does not generate sink" in str(e.value) and "scores" in str(e.value)


# -- on the GPU --------------------------------------------------------------------------------------

def written_out(torch, q, k, v, sinks, scale, causal):
    """softmax over [scores, sink] in fp64, the sink's column dropped before P.V: no attngen code."""
    s = torch.einsum("bhqd,bhkd->bhqk", q.double(), k.double()) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    col = sinks.double().reshape(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1)
    joined = torch.cat([s, col], dim=-1)
    p = torch.softmax(joined, dim=-1)[..., :-1]
    return torch.einsum("bhqk,bhkd->bhqd", p, v.double()), torch.logsumexp(joined, dim=-1)


@pytest.mark.gpu
@pytest.mark.parametrize("name", SINK_SPECS)
@pytest.mark.parametrize("causal", [False, True])
def test_kernel_and_reference_match_the_written_out_softmax(name, causal):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the sink specs are H100/H200 kernels")
    import attngen
    from attngen.core.variants import SINK
    from attngen.eval.cases import attention_torch, exact_fp32_matmul
    kernel = attngen.load(str(ROOT / "specs" / f"{name}.yaml"), synchronize=True)
    g = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = (torch.randn(2, 8, 333, 64, device="cuda", generator=g).half() for _ in range(3))
    sinks = torch.randn(8, device="cuda", generator=g) * 3
    sinks[0] = 40.0                   # one head whose sink takes every row's weight
    scale = 64 ** -0.5
    out, lse = kernel(q, k, v, causal=causal, sinks=sinks, return_lse=True)
    want, want_lse = written_out(torch, q, k, v, sinks, scale, causal)
    with exact_fp32_matmul(torch):
        ref, ref_lse = attention_torch(q.float(), k.float(), v.float(), scale=scale, causal=causal,
                                       modifiers=((SINK, sinks),))
    assert (ref.double() - want).abs().max().item() < 1e-5
    assert (ref_lse.double() - want_lse).abs().max().item() < 1e-4
    assert (out.double() - want).abs().max().item() < 4e-3
    assert (lse.double() - want_lse).abs().max().item() < 1e-3
    assert out[:, 0].abs().max().item() < 1e-6    # the head whose sink dwarfs every score


@pytest.mark.gpu
def test_sinks_must_be_one_fp32_logit_per_head():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the sink specs are H100/H200 kernels")
    import attngen
    kernel = attngen.load(str(ROOT / "specs" / "h100_mma_d64_sink.yaml"))
    q = torch.randn(1, 4, 16, 64, device="cuda").half()
    with pytest.raises(ValueError, match="pass sinks="):
        kernel(q, q, q)
    with pytest.raises(TypeError, match="float32"):
        kernel(q, q, q, sinks=torch.zeros(4, device="cuda").half())
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        kernel(q, q, q, sinks=torch.zeros(8, device="cuda"))
