"""GPU tests of the runtime as a library sees it: calls from any thread (workers with their own
streams, autograd's engine threads), any GPU of the process, on the caller's stream and inside CUDA
graph capture, with no host-device synchronization in a default call, and FlashAttention's
answer for empty inputs. Skipped with a reason where there is no GPU, torch or nvcc."""
from __future__ import annotations

import functools
import threading
from pathlib import Path

import pytest

import attngen
from attngen.eval.verify import attention_torch, error_bound, exact_fp32_matmul

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
MMA = ROOT / "specs" / "h100_mma_d64_m128n64w4s2x3q.yaml"        # forward + varlen, fp16 d64
WGMMA = ROOT / "specs" / "lab" / "h100_wgmma_d128.yaml"                   # TMA tensor maps, sm_90 only
TWINNED = ROOT / "specs" / "h100_wgmma_d128_persistent_q2.yaml"           # schedule.awaiting_twins, sm_90 only
DECODE = ROOT / "specs" / "h200_decode_d128_fused.yaml"           # fused combine: split counters per stream
DECODE_PAGED = ROOT / "specs" / "h200_decode_d128.yaml"           # paged: true (any page size)


@pytest.fixture
def torch():
    import torch
    return torch


@functools.lru_cache(maxsize=None)
def load_once(path: Path):
    return attngen.load(path)


def randn(torch, *shape, device="cuda", dtype=None):
    return torch.randn(*shape, device=device, dtype=dtype or torch.float16)


def error_and_bound(torch, out, q, k, v, *, causal=False) -> tuple[float, float]:
    """out's largest error against an fp32 reference, and the FlashAttention error rule's bound for it (twice
    torch's own low-precision attention's error), (B, H, S, D) tensors."""
    with exact_fp32_matmul(torch):
        ref, _ = attention_torch(q.float(), k.float(), v.float(), scale=q.shape[-1] ** -0.5, causal=causal)
    low, _ = attention_torch(q, k, v, scale=q.shape[-1] ** -0.5, causal=causal)
    return (out.float() - ref).abs().max().item(), error_bound((low.float() - ref).abs().max().item())


def assert_close_to_reference(torch, out, q, k, v, *, causal=False):
    """The FlashAttention error rule against an fp32 reference, (B, H, S, D) tensors."""
    err, bound = error_and_bound(torch, out, q, k, v, causal=causal)
    assert err <= bound, err


def wgmma_or_skip(torch):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kind runs on sm_90 only")
    return load_once(WGMMA)


def test_short_forward_calls_launch_the_awaiting_twin(torch):
    """On sm_90 a short call of a spec with awaiting twins launches the twin as a programmatic dependent: placed
    while the kernel ahead of it still runs, it waits for that kernel's writes itself. Calls queued back to back
    with no sync, each behind torch kernels that write its queries and a row of its keys, give bit for bit what
    the usual function gives launched the usual way, and the first is within the error rule of the fp32
    reference. A long call launches the usual function."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kind runs on sm_90 only")
    fwd = load_once(TWINNED)
    twin = fwd._forward_entry("causal", 2, 8, 1024, 1024)
    assert twin == fwd.entry["causal"] + "_awaits" and fwd.functions[twin].programmatic
    assert not fwd.functions[fwd.entry["causal"]].programmatic
    assert fwd._forward_entry("none", 2, 16, 8192, 8192) == fwd.entry["none"]
    plain = attngen.load(TWINNED)
    plain.awaiting_entry = {}                     # every call launches the usual function
    d = fwd.plan.head_dim
    q0, k, v = randn(torch, 2, 8, 1024, d), randn(torch, 2, 8, 1024, d), randn(torch, 2, 8, 1024, d)
    new_rows = randn(torch, 6, 2, 8, d)
    k0 = k.clone()

    def calls(kernel, causal):
        k.copy_(k0)
        outs = []
        for i in range(6):
            k[:, :, 100 + i].copy_(new_rows[i])          # written by the kernel just ahead of the call
            outs.append(kernel(q0 * (1.0 + i / 8), k, v, causal=causal))   # and so are its queries
        return outs
    for causal in (True, False):
        early = calls(fwd, causal)
        after = calls(plain, causal)
        torch.cuda.synchronize()
        for i, (a, b) in enumerate(zip(early, after)):
            assert torch.equal(a, b), f"call {i}: the twin differs by {(a - b).abs().max().item()}"
        k.copy_(k0)
        k[:, :, 100].copy_(new_rows[0])
        assert_close_to_reference(torch, early[0], q0, k, v, causal=causal)


# -- no synchronization ------------------------------------------------------------------------------

def test_default_calls_never_synchronize(torch):
    """torch's sync debug mode raises on any host-device synchronization: forward, varlen (without
    max_seqlen_q) and decode (contiguous, paged) run under it."""
    from attngen.runtime.calls.varlen import cu_seqlens
    fwd, dec, paged = load_once(MMA), load_once(DECODE), load_once(DECODE_PAGED)
    q, k, v = randn(torch, 2, 4, 300, 64), randn(torch, 2, 4, 300, 64), randn(torch, 2, 4, 300, 64)
    qd, kd, vd = randn(torch, 2, 32, 1, 128), randn(torch, 2, 8, 1000, 128), randn(torch, 2, 8, 1000, 128)
    lens = torch.tensor([999, 17], dtype=torch.int32, device="cuda")
    cu = cu_seqlens(torch, [100, 3, 257], "cuda")
    qp, kp, vp = randn(torch, 360, 4, 64), randn(torch, 360, 4, 64), randn(torch, 360, 4, 64)
    pool_k, pool_v = randn(torch, 130, 8, 16, 128), randn(torch, 130, 8, 16, 128)
    table = torch.arange(128, dtype=torch.int32, device="cuda").view(2, 64)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fwd(q, k, v, causal=True)
        fwd(q, k, v, return_lse=True)
        fwd.varlen(qp, kp, vp, cu, cu, causal=True)
        fwd.varlen(qp, kp, vp, cu, cu, max_seqlen_q=257, return_lse=True)
        dec(qd, kd, vd, cache_seqlens=lens)
        dec(qd, kd, vd, cache_seqlens=lens, causal=True, return_lse=True)
        paged(qd, pool_k, pool_v, cache_seqlens=lens, block_table=table)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


# -- empty inputs -------------------------------------------------------------------------------------

def test_empty_inputs_as_flash_attention(torch):
    """No keys: zeros and LSE -inf. No queries: empty results. Varlen with every key sequence
    empty (or no key rows at all): the same."""
    from attngen.runtime.calls.varlen import cu_seqlens
    fwd = load_once(MMA)
    q = randn(torch, 2, 4, 33, 64)
    empty_k = randn(torch, 2, 4, 0, 64)
    o, lse = fwd(q, empty_k, empty_k, return_lse=True)
    assert torch.equal(o, torch.zeros_like(o)) and torch.isneginf(lse).all()
    o, lse = fwd(randn(torch, 2, 4, 0, 64), randn(torch, 2, 4, 9, 64), randn(torch, 2, 4, 9, 64), return_lse=True)
    assert o.shape == (2, 4, 0, 64) and lse.shape == (2, 4, 0)
    qp = randn(torch, 40, 4, 64)
    for total_k, lens_k in ((0, [0, 0]), (8, [0, 0])):
        kp = randn(torch, total_k, 4, 64)
        o, lse = fwd.varlen(qp, kp, kp, cu_seqlens(torch, [30, 10], "cuda"), cu_seqlens(torch, lens_k, "cuda"),
                            return_lse=True)
        assert torch.equal(o, torch.zeros_like(o)) and torch.isneginf(lse).all()


# -- streams and graphs --------------------------------------------------------------------------------

def test_launch_on_the_callers_stream_and_in_a_graph(torch):
    """A call on a user stream is ordered by that stream alone; a forward and a decode captured in a
    CUDA graph replay correctly, the decode after its lengths change."""
    fwd, dec = load_once(MMA), load_once(DECODE)
    q, k, v = randn(torch, 1, 4, 500, 64), randn(torch, 1, 4, 700, 64), randn(torch, 1, 4, 700, 64)
    expect = fwd(q, k, v)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        got = fwd(q, k, v)
        got2 = got * 1
    torch.cuda.current_stream().wait_stream(stream)
    assert torch.equal(got2, expect)

    qd, kd, vd = randn(torch, 4, 32, 1, 128), randn(torch, 4, 8, 2048, 128), randn(torch, 4, 8, 2048, 128)
    lens = torch.tensor([2048, 5, 1000, 77], dtype=torch.int32, device="cuda")
    out = torch.empty_like(qd)
    fwd_out = torch.empty_like(q)
    for _ in range(2):   # warm up outside the capture (first-use work: split counters, per-device setup)
        dec(qd, kd, vd, cache_seqlens=lens, out=out)
        fwd(q, k, v, out=fwd_out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dec(qd, kd, vd, cache_seqlens=lens, out=out)
        fwd(q, k, v, out=fwd_out)
    for new in ([1, 2048, 64, 3], [100, 200, 300, 2000]):
        lens.copy_(torch.tensor(new, dtype=torch.int32))
        out.fill_(float("nan"))
        fwd_out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(fwd_out, expect)
        for b, n in enumerate(new):
            assert_close_to_reference(torch, out[b:b + 1], qd[b:b + 1], kd[b:b + 1, :, :n], vd[b:b + 1, :, :n])


# -- threads ----------------------------------------------------------------------------------------

def test_calls_from_threads_with_their_own_streams(torch):
    """8 threads, each on its own stream, call a forward (wgmma on sm_90, else mma), a decode with
    a fused combine and a varlen kernel 20 times each; every output equals the main thread's
    bitwise, and the main thread's pass the error rule."""
    from attngen.runtime.calls.varlen import cu_seqlens
    fwd = wgmma_or_skip(torch) if torch.cuda.get_device_capability() == (9, 0) else load_once(MMA)
    d = fwd.plan.head_dim
    dec, var = load_once(DECODE), load_once(MMA)
    q, k, v = randn(torch, 2, 8, 600, d), randn(torch, 2, 8, 600, d), randn(torch, 2, 8, 600, d)
    qd, kd, vd = randn(torch, 3, 32, 1, 128), randn(torch, 3, 8, 3000, 128), randn(torch, 3, 8, 3000, 128)
    lens = torch.tensor([3000, 1, 1500], dtype=torch.int32, device="cuda")
    cu = cu_seqlens(torch, [200, 1, 513], "cuda")
    qp, kp, vp = randn(torch, 714, 4, 64), randn(torch, 714, 4, 64), randn(torch, 714, 4, 64)
    calls = {
        "forward": lambda: fwd(q, k, v, causal=True),
        "decode": lambda: dec(qd, kd, vd, cache_seqlens=lens, causal=True),
        "varlen": lambda: var.varlen(qp, kp, vp, cu, cu, max_seqlen_q=513),
    }
    expect = {name: call() for name, call in calls.items()}
    torch.cuda.synchronize()
    assert_close_to_reference(torch, expect["forward"], q, k, v, causal=True)
    got, errors = [], []

    def worker():
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                mine = [(name, call()) for _ in range(20) for name, call in calls.items()]
            stream.synchronize()
            got.extend(mine)
        except Exception as exc:   # reported below with the thread's error
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert len(got) == 8 * 20 * 3
    mismatched = [name for name, out in got if not torch.equal(out, expect[name])]
    assert not mismatched, f"{len(mismatched)} of {len(got)} outputs differ: {sorted(set(mismatched))}"


def test_call_from_autograd_backward(torch):
    """PyTorch runs backward on its engine's threads: a kernel call from Function.backward runs."""
    fwd = load_once(MMA)
    k, v = randn(torch, 1, 4, 256, 64), randn(torch, 1, 4, 256, 64)

    class Attend(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q):
            return fwd(q, k, v)

        @staticmethod
        def backward(ctx, grad):
            ctx.thread = threading.get_ident()
            Attend.seen = threading.get_ident()
            return fwd(grad.contiguous(), k, v)   # a backward-style launch on the autograd thread

    q = randn(torch, 1, 4, 128, 64).requires_grad_()
    grad = randn(torch, 1, 4, 128, 64)
    Attend.apply(q).backward(grad)
    assert Attend.seen != threading.get_ident()      # it did run on another thread
    assert torch.equal(q.grad, fwd(grad, k, v))


def test_first_loads_at_once_compile_once(torch, tmp_path, monkeypatch):
    """Two threads that first load the same spec at once (empty cubin cache) both get a working
    kernel, and nvcc runs once."""
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path))
    compiled, kernels, errors = [], [], []
    barrier = threading.Barrier(2)

    def first_load():
        try:
            barrier.wait()
            kernels.append(attngen.load(MMA, on_compile=lambda arch: compiled.append(arch)))
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=first_load) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(kernels) == 2 and len(compiled) == 1
    q = randn(torch, 1, 2, 100, 64)
    assert torch.equal(kernels[0](q, q, q), kernels[1](q, q, q))


# -- two GPUs -----------------------------------------------------------------------------------------

def test_two_gpus_from_one_and_two_threads(torch):
    """A model whose two layers sit on cuda:0 and cuda:1 calls attention on both, from one thread
    and from two; every output passes the error rule and matches across threads bitwise."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs (the device tool's nvidia-h200-x2)")
    attend = attngen.attention if torch.cuda.get_device_capability() == (9, 0) else load_once(MMA)

    class Layer(torch.nn.Module):
        def __init__(self, device):
            super().__init__()
            self.qkv = torch.nn.Linear(256, 3 * 256, device=device, dtype=torch.float16)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, 4, 64).unbind(2)
            return attend(q, k, v, causal=True, layout="bshd").reshape(b, s, 256), (q, k, v)

    layers = [Layer("cuda:0"), Layer("cuda:1")]
    xs = [randn(torch, 2, 300, 256, device=f"cuda:{i}") for i in range(2)]
    with torch.no_grad():
        serial = [layer(x) for layer, x in zip(layers, xs)]
        for out, (q, k, v) in serial:
            t = lambda a: a.permute(0, 2, 1, 3)   # noqa: E731
            assert_close_to_reference(torch, t(out.view(2, 300, 4, 64)), t(q), t(k), t(v), causal=True)
        parallel = [None, None]

        def run(i):
            torch.cuda.set_device(i)
            with torch.no_grad():   # grad mode is per thread
                parallel[i] = layers[i](xs[i])[0]
            torch.cuda.synchronize(i)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for i in range(2):
        assert parallel[i] is not None and parallel[i].device.index == i
        assert torch.equal(parallel[i], serial[i][0])


# -- input errors recorded on the device -----------------------------------------------------------

def test_bad_inputs_are_recorded_and_raised_by_check_errors(torch):
    """Bad lengths, page ids and offsets cost no synchronization in the call: the kernel clamps
    them and records a flag that attngen.check_errors() raises (and clears); good calls record none."""
    from attngen.runtime import InputError
    from attngen.runtime.calls.varlen import cu_seqlens
    try:                                   # start clean (earlier tests pass bad inputs on purpose)
        attngen.check_errors()
    except InputError:
        pass
    dec, paged, var = load_once(DECODE), load_once(DECODE_PAGED), load_once(MMA)
    qd, kd = randn(torch, 2, 32, 1, 128), randn(torch, 2, 8, 1000, 128)
    good = torch.tensor([1000, 3], dtype=torch.int32, device="cuda")
    dec(qd, kd, kd, cache_seqlens=good)
    qp = randn(torch, 100, 4, 64)
    var.varlen(qp, qp, qp, cu_seqlens(torch, [60, 40], "cuda"), cu_seqlens(torch, [60, 40], "cuda"), max_seqlen_q=60)
    attngen.check_errors()                 # nothing recorded
    dec(qd, kd, kd, cache_seqlens=torch.tensor([1001, 3], dtype=torch.int32, device="cuda"))
    with pytest.raises(InputError, match="cache_seqlens entry was outside"):
        attngen.check_errors()
    attngen.check_errors()                 # cleared
    pool = randn(torch, 10, 8, 16, 128)
    table = torch.tensor([[0, 1, 99], [2, -1, -1]], dtype=torch.int32, device="cuda")   # 99: used, outside
    paged(qd, pool, pool, cache_seqlens=torch.tensor([40, 5], dtype=torch.int32, device="cuda"), block_table=table)
    with pytest.raises(InputError, match="block_table entry"):
        attngen.check_errors()
    bad = torch.tensor([0, 70, 50], dtype=torch.int32, device="cuda")                  # decreasing
    var.varlen(qp, qp, qp, bad, bad, max_seqlen_q=70)
    with pytest.raises(InputError, match="cu_seqlens offsets"):
        attngen.check_errors()
    long = randn(torch, 310, 4, 64)       # a 300-row sequence with max_seqlen_q 20: one 128-row block per sequence
    var.varlen(long, long, long, cu_seqlens(torch, [300, 10], "cuda"), cu_seqlens(torch, [300, 10], "cuda"),
               max_seqlen_q=20)
    with pytest.raises(InputError, match="longer than max_seqlen_q"):
        attngen.check_errors()
