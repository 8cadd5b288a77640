"""Learned attention sinks (gpt-oss): head h's logit joins every row's softmax denominator as a key
with no value. The forward kinds that take them add it where a row finishes (templates/variants/
sink.j2); the fp32 reference appends it as an extra column (core/variants.py extra_logits). The
GPU tests check kernel and reference against a third, written-out computation."""
from __future__ import annotations

from pathlib import Path

import pytest

from attngen.errors import SpecError
from attngen.core.spec_cells import cell_at
from attngen.render import render_spec_file
from attngen.spec import parse_spec

ROOT = Path(__file__).resolve().parent.parent
SINK_SPECS = ("h100_wgmma_d64_sink", "h100_mma_d64_sink")
DECODE_SINK = "h200_decode_d64_sink"


def spec_text(name: str) -> str:
    """The text of a spec's (first) cell, as a file of its own would hold it (attngen.core.spec_cells)."""
    return cell_at(ROOT / "specs" / f"{name}.yaml").text


def padded_call(torch, kernel, q, k, v, **kw):
    """(out, lse) of a (B, H, S, D) call: the kernel's padded function, or for a `varlen: only` spec
    (h100_mma_d64_sink serves varlen calls only) its varlen function over one sequence per batch
    row, its (total, H, D) output and (H, total) LSE laid back as (B, H, S, D) and (B, H, S)."""
    if kernel.plan.spec.padded:
        return kernel(q, k, v, return_lse=True, **kw)
    from attngen.runtime.calls.varlen import cu_seqlens
    b, h, sq, d = q.shape
    sk = k.shape[2]
    packed = [t.transpose(1, 2).reshape(-1, t.shape[1], d).contiguous() for t in (q, k, v)]
    out, lse = kernel.varlen(*packed, cu_seqlens(torch, [sq] * b, "cuda"), cu_seqlens(torch, [sk] * b, "cuda"),
                             max_seqlen_q=sq, return_lse=True, **kw)
    return out.reshape(b, sq, h, d).transpose(1, 2), lse.reshape(h, b, sq).transpose(0, 1)


@pytest.mark.parametrize("name", SINK_SPECS)
def test_the_finish_of_each_row_adds_the_sink(name):
    source = render_spec_file(ROOT / "specs" / f"{name}.yaml").parts[0].source
    assert "p.sinks[c.head]" in source and "float* sinks;" in source


@pytest.mark.parametrize("name", SINK_SPECS + (DECODE_SINK,))
def test_a_row_that_saw_no_key_takes_the_sinks_term_alone(name):
    """A row with no visible key (sum 0) has the sink's term alone as its total, exp2(sink - sink) = 1,
    so its LSE is the sink however negative (against the 0 of an unseen row's max, exp2f of a sink
    below -126 in log2 units flushes to 0 and the LSE would be -inf), and its output is zeros."""
    source = render_spec_file(ROOT / "specs" / f"{name}.yaml").parts[0].source
    assert "const bool seen = sum > 0.f;" in source
    assert "? fmaxf(m, sink) : sink;" in source or "? fmaxf(m_scaled, sink) : sink;" in source
    assert "? exp2f(m - top) : 0.f;" in source or "? exp2f(m_scaled - top) : 0.f;" in source
    assert ("const float total = seen ? fmaf(sum, kept, exp2f(sink - top)) : 1.f;" in source or
            "const float total = seen ? fmaf(sum, kept, exp2f(sink - top)) : (sink > -INFINITY ? 1.f : 0.f);" in source)


def test_a_spec_without_sinks_has_none_of_it():
    source = render_spec_file(ROOT / "specs" / "h100_wgmma_d64_window.yaml").parts[0].source
    assert "sinks" not in source


def test_a_kind_without_sinks_refuses_them():
    text = "\n".join(line for line in spec_text("h100_bwd_d64_wgmma_softcap").splitlines() if not line.startswith("#["))
    text = text.replace("dtypes: [fp16, bf16]", "dtype: fp16").replace("scores: [softcap]", "scores: [sink]")
    with pytest.raises(SpecError) as e:
        parse_spec(text, file="backward.yaml")
    assert "does not generate sink" in str(e.value) and "scores" in str(e.value)


# -- decode: the sink joins each row once, however many splits its keys take --------------------------


def decode_spec(tmp_path, combine: str | None = None) -> Path:
    """h200_decode_d64_sink's fp16 cell, with another combine where given, as a file of its own."""
    text = "\n".join(line for line in spec_text(DECODE_SINK).splitlines() if not line.startswith("#["))
    text = text.replace("dtypes: [fp16, bf16]", "dtype: fp16") + "\n"
    if combine:
        text = text.replace(f"name: {DECODE_SINK}\n", f"name: {DECODE_SINK}_{combine}\n") + f"combine: {combine}\n"
    path = tmp_path / f"{DECODE_SINK}_{combine or 'kernel'}.yaml"
    path.write_text(text)
    return path


def test_decode_adds_the_sink_where_an_unsplit_row_ends_and_once_in_the_combine():
    split, combine = (part.source for part in render_spec_file(ROOT / "specs" / f"{DECODE_SINK}.yaml").parts)
    # unsplit rows: the sink of the row's own head (a block's rows span the heads of one KV head)
    assert "const int head = c.kv_head * c.group + r / p.seqlen_q" in split
    assert "p.num_splits == 1 ? p.sinks[head]" in split
    # split rows: the combine adds it to the row's LSE over the splits, once
    assert combine.count("p.sinks[") == 1 and "float* sinks;" in combine
    assert "log1pf(expf(-fabsf(total - sink)))" in combine


@pytest.mark.parametrize("combine", ["fused", "auto"])
def test_a_decode_split_kernel_that_merges_adds_the_sink_in_its_merge(tmp_path, combine):
    parts = render_spec_file(decode_spec(tmp_path, combine)).parts
    assert len(parts) == 1
    source = parts[0].source
    assert source.count("p.sinks[") == 2   # where an unsplit row ends, and in the merge of the splits
    assert "log1pf(expf(-fabsf(total - sink)))" in source


def test_a_decode_spec_without_sinks_has_none_of_it():
    for part in render_spec_file(ROOT / "specs" / "h200_decode_d64.yaml").parts:
        assert "sink" not in part.source


def test_the_decode_combine_reads_the_sinks_only_where_the_spec_has_them():
    from attngen.plan import make_plan
    from attngen.spec import load_spec
    with_sinks = make_plan(load_spec(ROOT / "specs" / f"{DECODE_SINK}.yaml"))
    without = make_plan(load_spec(ROOT / "specs" / "h200_decode_d64.yaml"))
    assert "sinks" in with_sinks.parts[1].reads and "sinks" not in without.parts[1].reads
    assert with_sinks.parts[1].reads[:len(without.parts[1].reads)] == without.parts[1].reads


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
    from attngen.eval.verify.cases import attention_torch, exact_fp32_matmul
    kernel = attngen.load(str(ROOT / "specs" / f"{name}.yaml"), synchronize=True)
    g = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = (torch.randn(2, 8, 333, 64, device="cuda", generator=g).half() for _ in range(3))
    sinks = torch.randn(8, device="cuda", generator=g) * 3
    sinks[0] = 40.0                   # one head whose sink takes every row's weight
    scale = 64 ** -0.5
    out, lse = padded_call(torch, kernel, q, k, v, causal=causal, sinks=sinks)
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
@pytest.mark.parametrize("name", SINK_SPECS)
def test_a_row_that_sees_no_key_has_the_sink_as_its_lse(name):
    """Bottom-right causal with more queries than keys: the first Sq - Sk rows see no key. Their
    output is zeros and their LSE the head's sink, also for sinks far below fp32 exp's range (-100 and
    -200: exp2f of them in log2 units is 0); the other rows match the written-out softmax."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the sink specs are H100/H200 kernels")
    import attngen
    kernel = attngen.load(str(ROOT / "specs" / f"{name}.yaml"), synchronize=True)
    g = torch.Generator(device="cuda").manual_seed(5)
    sq, sk = 200, 64
    q = torch.randn(2, 4, sq, 64, device="cuda", generator=g).half()
    k, v = (torch.randn(2, 4, sk, 64, device="cuda", generator=g).half() for _ in range(2))
    sinks = torch.tensor([-200.0, -100.0, 0.5, 40.0], device="cuda")
    scale = 64 ** -0.5
    out, lse = padded_call(torch, kernel, q, k, v, causal=True, alignment="bottom_right", sinks=sinks)
    s = torch.einsum("bhqd,bhkd->bhqk", q.double(), k.double()) * scale
    own = torch.arange(sq, device="cuda")[:, None] + sk - sq
    s = s.masked_fill(torch.arange(sk, device="cuda")[None, :] > own, float("-inf"))
    joined = torch.cat([s, sinks.double().reshape(1, -1, 1, 1).expand(2, -1, sq, 1)], dim=-1)
    want = torch.einsum("bhqk,bhkd->bhqd", torch.softmax(joined, dim=-1)[..., :-1], v.double())
    want_lse = torch.logsumexp(joined, dim=-1)
    blind = sq - sk
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert out[:, :, :blind].abs().max().item() == 0
    assert (lse[:, :, :blind].double() - sinks.double().reshape(1, -1, 1)).abs().max().item() < 1e-3
    assert (out.double() - want).abs().max().item() < 4e-3
    assert (lse.double() - want_lse).abs().max().item() < 1e-3


@pytest.mark.gpu
def test_sinks_must_be_one_fp32_logit_per_head():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the sink specs are H100/H200 kernels")
    import attngen
    kernel = attngen.load(str(ROOT / "specs" / "h100_wgmma_d64_sink.yaml"))
    q = torch.randn(1, 4, 16, 64, device="cuda").half()
    with pytest.raises(ValueError, match="pass sinks="):
        kernel(q, q, q)
    with pytest.raises(TypeError, match="float32"):
        kernel(q, q, q, sinks=torch.zeros(4, device="cuda").half())
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        kernel(q, q, q, sinks=torch.zeros(8, device="cuda"))


def gradients(torch, q, k, v, sinks, dout, scale, window, dtype, softcap=None):
    """(o, dq, dk, dv, dsinks) of the written-out softmax with sinks, computed in `dtype` (GQA by
    repeating K and V; window (left, right) top-left, the right side closed by causal; softcap: the
    scaled scores capped, cap * tanh(s / cap), before the mask)."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v, sinks)]
    qq, kk, vv, ss = leaves
    group = qq.shape[1] // kk.shape[1]
    kk, vv = kk.repeat_interleave(group, dim=1), vv.repeat_interleave(group, dim=1)
    s = torch.einsum("bhqd,bhkd->bhqk", qq, kk) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    rows = torch.arange(s.shape[2], device=s.device)[:, None]
    keys = torch.arange(s.shape[3], device=s.device)[None, :]
    hidden = keys > rows
    if window is not None:
        hidden = hidden | (keys < rows - window[0])
    s = s.masked_fill(hidden, float("-inf"))
    joined = torch.cat([s, ss.reshape(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1)], dim=-1)
    o = torch.einsum("bhqk,bhkd->bhqd", torch.softmax(joined, dim=-1)[..., :-1], vv)
    o.backward(dout.to(dtype))
    return (o.detach(), *(t.grad for t in leaves))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("window", [None, (128, 0)], ids=["causal", "window128"])
def test_attention_trains_with_sinks(dtype, window):
    """A gpt-oss layer's call (d64, 8 query heads on 2 KV heads, causal, a 128-key window on
    alternate layers): attngen.attention's output and its gradients in q, k, v and the sinks, against
    the fp32 written-out softmax, within the error rule of the same computation in the inputs' dtype."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the dispatch table serves sinks on sm_90 (H100/H200)")
    import attngen
    from attngen.eval.verify.cases import error_bound, exact_fp32_matmul
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(11)
    q = torch.randn(2, 8, 300, 64, device="cuda", generator=g).to(dt).requires_grad_()
    k, v = (torch.randn(2, 2, 300, 64, device="cuda", generator=g).to(dt).requires_grad_() for _ in range(2))
    sinks = (torch.randn(8, device="cuda", generator=g) * 2).requires_grad_()
    dout = torch.randn(2, 8, 300, 64, device="cuda", generator=g).to(dt)
    o = attngen.attention(q, k, v, causal=True, window=window, sinks=sinks)
    o.backward(dout)
    got = (o.detach(), q.grad, k.grad, v.grad, sinks.grad)
    with exact_fp32_matmul(torch):
        ref = gradients(torch, q, k, v, sinks, dout, 0.125, window, torch.float32)
    low = gradients(torch, q, k, v, sinks, dout, 0.125, window, dt)
    for name, a, r, l in zip(("out", "dq", "dk", "dv", "dsinks"), got, ref, low):
        assert a is not None and a.shape == r.shape, name
        err, low_err = (a.float() - r).abs().max().item(), (l.float() - r).abs().max().item()
        assert err <= error_bound(low_err), f"{name}: {err:.3g} > bound {error_bound(low_err):.3g} (torch {low_err:.3g})"


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
@pytest.mark.parametrize("window", [None, (128, 0)], ids=["causal", "window128"])
def test_attention_trains_sinks_beside_a_softcap(head_dim, window):
    """Softcap with learned sinks (a softcap_sink member at d64, d128 and d256; d96 padded to d128's):
    the sinks sit in the kernel, so they train, and the output and the gradients in q, k, v and the
    sinks match the fp32 written-out softmax within the error rule, as without the cap."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the dispatch table serves sinks on sm_90 (H100/H200)")
    import attngen
    from attngen.eval.verify.cases import error_bound, exact_fp32_matmul
    dt, scale, cap = torch.bfloat16, head_dim ** -0.5, 30.0
    g = torch.Generator(device="cuda").manual_seed(head_dim)
    q = (torch.randn(2, 8, 300, head_dim, device="cuda", generator=g) * 2).to(dt).requires_grad_()
    k, v = (torch.randn(2, 2, 300, head_dim, device="cuda", generator=g).to(dt).requires_grad_() for _ in range(2))
    sinks = (torch.randn(8, device="cuda", generator=g) * 2).requires_grad_()
    dout = torch.randn(2, 8, 300, head_dim, device="cuda", generator=g).to(dt)
    o = attngen.attention(q, k, v, causal=True, window=window, softcap=cap, sinks=sinks)
    o.backward(dout)
    got = (o.detach(), q.grad, k.grad, v.grad, sinks.grad)
    with exact_fp32_matmul(torch):
        ref = gradients(torch, q, k, v, sinks, dout, scale, window, torch.float32, softcap=cap)
    low = gradients(torch, q, k, v, sinks, dout, scale, window, dt, softcap=cap)
    for name, a, r, l in zip(("out", "dq", "dk", "dv", "dsinks"), got, ref, low):
        assert a is not None and a.shape == r.shape, name
        err, low_err = (a.float() - r).abs().max().item(), (l.float() - r).abs().max().item()
        assert err <= error_bound(low_err), f"{name}: {err:.3g} > bound {error_bound(low_err):.3g} (torch {low_err:.3g})"


# -- decode on the GPU ---------------------------------------------------------------------------------

def decode_written_out(torch, q, k, v, lengths, sinks, scale, window):
    """Each sequence's new tokens (the last Sq of its len keys, causal) against its keys, softmax over
    [scores, sink] in fp64 with the sink's column dropped before P.V; window (left, 0) from each
    token's own position. No attngen code."""
    heads, seqlen_q = q.shape[1], q.shape[2]
    group = heads // k.shape[1]
    outs, lses = [], []
    for b, n in enumerate(lengths):
        kk = k[b:b + 1, :, :n].double().repeat_interleave(group, dim=1)
        vv = v[b:b + 1, :, :n].double().repeat_interleave(group, dim=1)
        s = torch.einsum("bhqd,bhkd->bhqk", q[b:b + 1].double(), kk) * scale
        own = n - seqlen_q + torch.arange(seqlen_q, device=q.device)[:, None]
        keys = torch.arange(n, device=q.device)[None, :]
        hidden = keys > own
        if window is not None:
            hidden = hidden | (keys < own - window[0])
        s = s.masked_fill(hidden, float("-inf"))
        joined = torch.cat([s, sinks.double().reshape(1, -1, 1, 1).expand(1, heads, seqlen_q, 1)], dim=-1)
        outs.append(torch.einsum("bhqk,bhkd->bhqd", torch.softmax(joined, dim=-1)[..., :-1], vv))
        lses.append(torch.logsumexp(joined, dim=-1))
    return torch.cat(outs), torch.cat(lses)


def decode_inputs(torch, dtype, heads=16, kv_heads=2, seqlen_q=1, capacity=1500, lengths=(1500, 333, 1)):
    g = torch.Generator(device="cuda").manual_seed(3)
    dt = getattr(torch, dtype)
    q = torch.randn(len(lengths), heads, seqlen_q, 64, device="cuda", generator=g).to(dt)
    k, v = (torch.randn(len(lengths), kv_heads, capacity, 64, device="cuda", generator=g).to(dt) for _ in range(2))
    sinks = torch.randn(heads, device="cuda", generator=g) * 2
    sinks[0] = 40.0                   # one head whose sink takes every row's weight
    sinks[1] = -40.0                  # and one whose sink takes none
    return q, k, v, sinks, torch.tensor(lengths, dtype=torch.int32, device="cuda")


def decode_sm90(torch):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the decode sink spec is an H100/H200 kernel")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("window", [None, (128, 0)], ids=["causal", "window128"])
@pytest.mark.parametrize("seqlen_q", [1, 3])
def test_decode_sinks_join_each_row_once_however_many_splits(dtype, window, seqlen_q):
    """One split (the row ends in the split kernel), several (the combine merges them) and the
    heuristic's: the same output and LSE, each against the written-out fp64 softmax with the sink and
    within the error rule of torch's own computation in the inputs' dtype; contiguous and paged."""
    torch = pytest.importorskip("torch")
    decode_sm90(torch)
    import attngen
    from attngen.core.variants import SINK
    from attngen.eval.verify.cases import error_bound
    from attngen.eval.verify.decode import DecodeCase, paged_cache, reference
    cell = DECODE_SINK + ("_bf16" if dtype == "bfloat16" else "")
    kernel = attngen.load(str(ROOT / "specs" / f"{cell}.yaml"), synchronize=True)
    q, k, v, sinks, lens = decode_inputs(torch, dtype, seqlen_q=seqlen_q)
    lengths = tuple(lens.tolist())
    scale = 64 ** -0.5
    want, want_lse = decode_written_out(torch, q, k, v, lengths, sinks, scale, window)
    case = DecodeCase(q.shape[0], q.shape[1], k.shape[1], seqlen_q, k.shape[2], lengths, causal=True, window=window)
    ref, ref_lse, low = reference(torch, q, k, v, lengths, case, scale, ((SINK, sinks),))
    assert (ref.double() - want).abs().max().item() < 1e-5
    assert (ref_lse.double() - want_lse).abs().max().item() < 1e-4
    bound = error_bound((low.float() - ref).abs().max().item())
    kp, vp, table = paged_cache(torch, k, v, lengths, 16, "bhsd")
    outs = []
    for paged in (False, True):
        kc, vc, tb = (kp, vp, table) if paged else (k, v, None)
        for splits in (1, 7, None):
            out, lse = kernel(q, kc, vc, cache_seqlens=lens, block_table=tb, causal=True, window=window,
                              num_splits=splits, sinks=sinks, return_lse=True)
            label = f"paged={paged} splits={splits} ({kernel.last_splits})"
            assert (out.float() - ref).abs().max().item() <= bound, label
            assert (lse.double() - want_lse).abs().max().item() < 1e-3, label
            assert out[:, 0].abs().max().item() < 1e-6, label    # the head whose sink dwarfs every score
            outs.append(out.float())
    for o in outs[1:]:
        assert (o - outs[0]).abs().max().item() <= bound


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_decode_a_sequence_with_no_key_has_the_sink_as_its_lse(dtype):
    """A sequence whose cache holds no key (cache_seqlens 0): its rows see nothing, so each gives zeros
    and its head's sink as LSE, for sinks far below fp32 exp's range too (-100, -200), unsplit (the
    row ends in the split kernel) and split (the combine adds the sink)."""
    torch = pytest.importorskip("torch")
    decode_sm90(torch)
    import attngen
    cell = DECODE_SINK + ("_bf16" if dtype == "bfloat16" else "")
    kernel = attngen.load(str(ROOT / "specs" / f"{cell}.yaml"), synchronize=True)
    q, k, v, sinks, _ = decode_inputs(torch, dtype, heads=8, kv_heads=2, capacity=600, lengths=(600, 0, 77))
    sinks[2], sinks[3] = -100.0, -200.0
    lengths = (600, 0, 77)
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    want, want_lse = decode_written_out(torch, q, k, v, lengths, sinks, 64 ** -0.5, None)
    for splits in (1, 4):
        out, lse = kernel(q, k, v, cache_seqlens=lens, causal=True, num_splits=splits, sinks=sinks, return_lse=True)
        assert torch.isfinite(out).all() and torch.isfinite(lse).all(), splits
        assert out[1].abs().max().item() == 0, splits
        assert (lse[1, :, 0].double() - sinks.double()).abs().max().item() < 1e-3, splits
        assert (out.double() - want).abs().max().item() < (4e-3 if dtype == "float16" else 3e-2), splits
        assert (lse.double() - want_lse).abs().max().item() < 1e-3, splits


@pytest.mark.gpu
@pytest.mark.parametrize("combine", ["fused", "auto"])
def test_decode_sinks_in_a_split_kernel_that_merges(tmp_path, combine):
    """The fused and auto combines merge the splits inside the split kernel: the sink joins there,
    once, as in the combine kernel."""
    torch = pytest.importorskip("torch")
    decode_sm90(torch)
    import attngen
    kernel = attngen.load(str(decode_spec(tmp_path, combine)), synchronize=True)
    q, k, v, sinks, lens = decode_inputs(torch, "float16")
    lengths = tuple(lens.tolist())
    want, want_lse = decode_written_out(torch, q, k, v, lengths, sinks, 64 ** -0.5, None)
    for splits in (1, 2, 9):
        out, lse = kernel(q, k, v, cache_seqlens=lens, causal=True, num_splits=splits, sinks=sinks, return_lse=True)
        assert (out.double() - want).abs().max().item() < 4e-3, splits
        assert (lse.double() - want_lse).abs().max().item() < 1e-3, splits


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("window", [None, (128, 0)], ids=["causal", "window128"])
def test_gpt_oss_decode_step_with_sinks(dtype, window):
    """A gpt-oss decode step through attngen.attention_with_kvcache (d64, 64 query heads on 8 KV
    heads, learned sinks on every layer, a 128-key window on alternate ones; paged by 16 keys and
    contiguous): the table serves it, within the error rule against the fp32 reference; the op passes
    opcheck, and a call with sinks that need gradients is refused (decode is forward only)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the dispatch table serves decode sinks on sm_90 (H100/H200)")
    import attngen
    from attngen.core.variants import SINK
    from attngen.eval.verify.cases import error_bound
    from attngen.eval.verify.decode import DecodeCase, paged_cache, reference
    lengths = (4100, 129, 2000, 1)
    q, k, v, sinks, lens = decode_inputs(torch, dtype, heads=64, kv_heads=8, capacity=4100, lengths=lengths)
    case = DecodeCase(4, 64, 8, 1, 4100, lengths, causal=True, window=window)
    ref, _, low = reference(torch, q, k, v, lengths, case, 0.125, ((SINK, sinks),))
    bound = error_bound((low.float() - ref).abs().max().item())
    kp, vp, table = paged_cache(torch, k, v, lengths, 16, "bhsd")
    with torch.no_grad():
        for kc, vc, tb in ((k, v, None), (kp, vp, table)):
            out = attngen.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=tb, causal=True,
                                                 window=window, sinks=sinks)
            err = (out.float() - ref).abs().max().item()
            assert err <= bound, f"paged={tb is not None}: {err:.3g} > {bound:.3g}"
    torch.library.opcheck(torch.ops.attngen.attention_with_kvcache_variant.default,
                          (q, k, v, lens, None, True, None, None, "bhsd", None if window is None else list(window),
                           None, None, sinks))
    with pytest.raises(NotImplementedError, match="no backward for decode"):
        attngen.attention_with_kvcache(q, k, v, cache_seqlens=lens, causal=True, sinks=sinks.requires_grad_())


# -- sinks beside modifiers no sink kernel has: the kernel without them, the sinks joined after ----------

def test_sinks_with_modifiers_no_sink_kernel_has_are_joined_after_the_kernel():
    """The committed table has sink kernels for the masks gpt-oss uses, and beside softcap, ALiBi and both
    in the forward and varlen calls (the *_sink members), none beside them in decode: those calls run
    the kernel of their other modifiers and join the sinks after it (ops.library.join_sinks); a call a
    sink kernel serves (its own head dim or padded) takes it."""
    from attngen.ops.table import load_table, sinks_apart, table_path
    entries = load_table(table_path(ROOT / "specs"))
    for call in ("forward", "varlen", "decode"):
        for scores in ("softcap+sink", "alibi+sink", "softcap+alibi+sink"):
            for d in (64, 80, 128, 256):
                apart = call == "decode"
                assert sinks_apart(entries, call, "sm_90", "bf16", d, 0, "causal", scores) == apart, (call, scores, d)
        assert not sinks_apart(entries, call, "sm_90", "bf16", 64, 0, "causal", "sink")   # its own kernel
        assert not sinks_apart(entries, call, "sm_90", "bf16", 80, 0, "causal", "sink")   # padded to d128's
        assert not sinks_apart(entries, call, "sm_90", "bf16", 64, 0, "causal", "softcap")  # no sinks
    # decode with softcap and a window under sinks: a window kernel of softcap exists at d128 and d256
    assert sinks_apart(entries, "decode", "sm_90", "fp16", 128, 0, "window", "softcap+sink", paged=True)
    # nothing serves the modifiers without the sinks either: not apart (the lookup refuses it by name)
    assert not sinks_apart(entries, "forward", "sm_89", "fp16", 64, 0, "causal", "softcap+sink")


@pytest.mark.parametrize("rows", ["bhsd", "bshd", "packed"])
def test_joining_sinks_after_gives_the_softmax_with_the_sink_column(rows):
    """join_sinks on attention computed without sinks equals the softmax with each head's sink as one
    more column (written out here), output and LSE, including a row that sees no key (output 0, LSE the
    sink) and a head whose sink is -inf (nothing changes)."""
    torch = pytest.importorskip("torch")
    from attngen.ops.library import join_sinks
    g = torch.Generator().manual_seed(5)
    b, h, s, n, d = 2, 3, 5, 7, 4
    q, k, v = torch.randn(b, h, s, d, generator=g), torch.randn(b, h, n, d, generator=g), torch.randn(b, h, n, d, generator=g)
    sinks = torch.randn(h, generator=g) * 2
    sinks[2] = float("-inf")
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k).double()
    scores[0, 1, 3] = float("-inf")                              # a row that sees no key
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("bhqk,bhkd->bhqd", torch.softmax(scores, dim=-1).nan_to_num(0.0), v.double())
    joined = torch.cat([scores, sinks.double().reshape(1, -1, 1, 1).expand(b, h, s, 1)], dim=-1)
    want_out = torch.einsum("bhqk,bhkd->bhqd", torch.softmax(joined, dim=-1)[..., :-1], v.double())
    want_lse = torch.logsumexp(joined, dim=-1)
    if rows == "bhsd":
        got_out, got_lse = join_sinks(out.clone(), lse, sinks, rows)
    elif rows == "bshd":
        got_out, got_lse = join_sinks(out.transpose(1, 2).contiguous(), lse, sinks, rows)
        got_out = got_out.transpose(1, 2)
    else:   # one sequence per batch entry laid end to end: out (T, H, D), lse (H, T)
        flat_out = out.transpose(1, 2).reshape(b * s, h, d)
        flat_lse = lse.transpose(0, 1).reshape(h, b * s)
        got_out, got_lse = join_sinks(flat_out.clone(), flat_lse, sinks, rows)
        got_out = got_out.reshape(b, s, h, d).transpose(1, 2)
        got_lse = got_lse.reshape(h, b, s).transpose(0, 1)
    assert torch.allclose(got_out, want_out, atol=1e-12) and torch.allclose(got_lse, want_lse, atol=1e-12)
    assert got_lse[0, 1, 3] == sinks[1] and not got_out[0, 1, 3].any()
    # the sinks pass the checks a sink kernel makes: one fp32 logit per query head
    with pytest.raises(ValueError, match=r"sinks must have shape \(3,\)"):
        join_sinks(out.clone(), lse, sinks[:1], "bhsd")
    with pytest.raises(TypeError, match="float32"):
        join_sinks(out.clone(), lse, sinks.half(), "bhsd")


def test_an_outputs_error_moves_the_sinks_gradient_taken_from_it_by_sink_output_error():
    """verify's second yardstick for the sinks' gradient (eval.verify.backward.sink_output_error): the
    gradient taken from an output minus the one taken from the exact output; nothing for the exact one."""
    torch = pytest.importorskip("torch")
    from attngen.eval.verify.backward import sink_output_error
    from attngen.ops.library import sink_gradient
    g = torch.Generator().manual_seed(2)
    out, dout = torch.randn(2, 3, 9, 8, generator=g), torch.randn(2, 3, 9, 8, generator=g)
    lse, sinks = torch.randn(2, 3, 9, generator=g), torch.randn(3, generator=g)
    rounded = out.to(torch.bfloat16)
    moved = sink_output_error(torch, dout, rounded, out, lse, sinks)
    want = sink_gradient(dout, rounded.float(), lse, sinks, "bhsd") - sink_gradient(dout, out, lse, sinks, "bhsd")
    assert moved.shape == (3,) and torch.allclose(moved, want, rtol=1e-3, atol=1e-5) and moved.abs().max() > 0
    assert not sink_output_error(torch, dout, out, out, lse, sinks).any()


@pytest.mark.gpu
@pytest.mark.parametrize("rows", ["bhsd", "bshd", "packed"])
def test_joining_sinks_through_the_merge_kernel_matches_the_torch_ops(rows):
    """join_sinks with merge=True (decode's) runs the table's merge kernel (a part of zeros whose LSE is the
    sink); the same join in torch ops (the forward's and varlen's) agrees within a rounding of the
    output, and the LSEs within fp32's."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the dispatch table's merge kernels serve sm_90 (H100/H200) here")
    from attngen.ops import library
    g = torch.Generator(device="cuda").manual_seed(9)
    b, h, s, d = 2, 8, 77, 128
    out = torch.randn(b, h, s, d, device="cuda", generator=g).to(torch.bfloat16)
    lse = torch.randn(b, h, s, device="cuda", generator=g) * 3
    lse[0, 2, 5] = float("-inf")                                   # a row that saw no key
    sinks = torch.randn(h, device="cuda", generator=g) * 2
    if rows == "bshd":
        out = out.transpose(1, 2).contiguous()
    elif rows == "packed":
        out, lse = out.transpose(1, 2).reshape(b * s, h, d).contiguous(), lse.transpose(0, 1).reshape(h, b * s).contiguous()
    assert library.DISPATCH.serves("merge", 0, out.dtype, d, "none")
    merged, merged_lse = library.join_sinks(out.clone(), lse, sinks, rows, merge=True)
    factor = torch.exp(lse - torch.logaddexp(lse, sinks.reshape(-1, 1))).nan_to_num(0.0)
    factor = factor.transpose(1, 2) if rows == "bshd" else factor.t() if rows == "packed" else factor
    want = (out.float() * factor.unsqueeze(-1))
    assert (merged.float() - want).abs().max().item() <= 2 ** -7 * want.abs().max().item()
    assert torch.allclose(merged_lse, torch.logaddexp(lse, sinks.reshape(-1, 1)), atol=1e-5)


def test_sinks_joined_after_the_kernel_refuse_a_gradient_of_their_own(monkeypatch):
    """ops.library.refuse_joined_sinks_gradient: NotImplementedError, by name, only where the call's sinks
    need a gradient and the table joins them after the kernel of the other modifiers (sinks_apart); sinks
    that need none, a sink kernel, or tensors off the GPU pass."""
    torch = pytest.importorskip("torch")
    from attngen.ops import library
    asked = []

    def apart(call, index, dtype, d, dv, mask, scores, paged=None):
        asked.append((call, index, d, dv, mask, scores, paged))
        return scores != "sink"

    monkeypatch.setattr(library.DISPATCH, "sinks_apart", apart)

    class OnGpu:          # q and v as the check reads them: device, dtype, head dim
        def __init__(self, d):
            self.dtype, self.shape = torch.bfloat16, (1, 4, 16, d)

        def get_device(self):
            return 0

    trained, frozen = torch.zeros(4, requires_grad=True), torch.zeros(4)
    with pytest.raises(NotImplementedError, match="learned sinks and softcap.*sinks.detach"):
        library.refuse_joined_sinks_gradient("forward", OnGpu(64), OnGpu(64), True, None, 30.0, None, trained)
    assert asked == [("forward", 0, 64, 64, "causal", "softcap+sink", None)]
    library.refuse_joined_sinks_gradient("varlen", OnGpu(64), OnGpu(64), True, None, None, None, trained,
                                         paged=False)   # a sink kernel
    assert asked[-1][-1] is False
    library.refuse_joined_sinks_gradient("forward", OnGpu(64), OnGpu(64), True, None, 30.0, None, frozen)
    library.refuse_joined_sinks_gradient("forward", OnGpu(64), OnGpu(64), True, None, 30.0, None, None)
    cpu = torch.zeros(1, 4, 16, 64)
    library.refuse_joined_sinks_gradient("forward", cpu, cpu, True, None, 30.0, None, trained)
    assert len(asked) == 2
