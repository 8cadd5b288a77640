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
    out, lse = kernel(q, k, v, causal=True, alignment="bottom_right", sinks=sinks, return_lse=True)
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
    kernel = attngen.load(str(ROOT / "specs" / "h100_mma_d64_sink.yaml"))
    q = torch.randn(1, 4, 16, 64, device="cuda").half()
    with pytest.raises(ValueError, match="pass sinks="):
        kernel(q, q, q)
    with pytest.raises(TypeError, match="float32"):
        kernel(q, q, q, sinks=torch.zeros(4, device="cuda").half())
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        kernel(q, q, q, sinks=torch.zeros(8, device="cuda"))


def gradients(torch, q, k, v, sinks, dout, scale, window, dtype):
    """(o, dq, dk, dv, dsinks) of the written-out softmax with sinks, computed in `dtype` (GQA by
    repeating K and V; window (left, right) top-left, the right side closed by causal)."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v, sinks)]
    qq, kk, vv, ss = leaves
    group = qq.shape[1] // kk.shape[1]
    kk, vv = kk.repeat_interleave(group, dim=1), vv.repeat_interleave(group, dim=1)
    s = torch.einsum("bhqd,bhkd->bhqk", qq, kk) * scale
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
