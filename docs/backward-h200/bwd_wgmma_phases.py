"""Where a Hopper backward step's time goes, by clock stamps: each consumer warpgroup's first warp
writes clock64 at the phase boundaries of every step of its walk (plain stores into a device array,
read back afterwards), and the script prints the median cycles of each phase over every step of
every block.

Usage: python3 docs/backward-h200/bwd_wgmma_phases.py [OUT.json]

The stamps are text edits of the generated main source of h100_bwd_d128_wgmma and h100_bwd_d64_wgmma
(non-deterministic, no score modifiers: the path those specs run), compiled beside the untouched
kernel; both are timed (`attngen bench`'s queued timing) so that the stamps' own cost shows.
Shapes: 4x16x2048, fp16, causal and not.
"""
import ctypes
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch

import attngen
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from gpu_timing import queued_med

MAX_STEPS = 40      # stamps kept per walk (the 2048 walks take 32 steps of 64 rows, 16 of 128)
SLOTS = 16          # stamps per step
# (text after which a stamp goes (or, with a "|", where), slot, name of the phase ending there), in
# program order. (The a2bd8a4 table in docs/performance.md was taken with stamps at that kernel's top
# barrier and TMA issue, which the kernel no longer has.)
STAMPS = [
    ("        const QueryStep st = query_step<kVarlen>(head, m0, seq, p);\n", 0, "loop top"),
    ("        const float stat = more ? row_stat(query_step<kVarlen>(next_head, next_m0, seq, p), tid, p) : 0.f;\n",
     1, "next step's row statistic (load issued)"),
    ("    mbarrier_wait(query_bar(smem_addr, stage), phase);   // the stage's Q and dO have landed (TMA)\n", 2,
     "wait for this step's Q/dO"),
    ("    issue_keys_by_queries(dp, sV, key0, sDO);\n", 3, "issue S^T, dP^T"),
    ("        wgmma_wait<1>();   // S^T is ready; dP^T may still run\n", 4, "wait S^T"),
    ("        a_fragments(pa, s);\n|        wgmma_wait<0>();", 5, "P^T (exp2), pack"),
    ("        score_gradients(dp, s, sDelta, lane);\n", 6, "wait dP^T, dS^T"),
    ("    store_ds(sDS, da, key0 + 16 * (warp % 4), lane);\n", 7, "pack, store dS^T"),
    ("    __syncthreads();              // dS^T of every warpgroup is in the tile\n", 8, "fence, dS barrier"),
    ("    issue_next();\n", 9, "next Q/dO TMA issue"),
    ("        wgmma_wait<1>();   // dQ is done (dS^T and the K tile read); dV and dK may still run\n", 10,
     "issue dQ dV dK, wait dQ"),
    ("    add_dq<kMask, kDeterministic>(dq, sQ, st, n0, tid, seq, p);\n", 11, "dQ red.global.add"),
    ("    wgmma_wait<0>();   // dV and dK: the fragments and this stage's tiles are read\n", 12, "wait dV, dK"),
]
PRELUDE = f"""
__device__ unsigned long long attngen_phase_clock[1024 * 2 * {MAX_STEPS} * {SLOTS}];
// Warp 0 of each warpgroup: every lane reads the same clock and writes the same slot.
#define PHASE_STAMP(k) do {{ if ((threadIdx.x & 127) < 32 && phase_step < {MAX_STEPS}) {{ \\
    unsigned long long t_; asm volatile("mov.u64 %0, %%clock64;" : "=l"(t_) :: "memory"); \\
    const unsigned b_ = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z); \\
    if (b_ < 1024) attngen_phase_clock[((b_ * 2 + threadIdx.x / 128) * {MAX_STEPS} + phase_step) * {SLOTS} + (k)] = t_; \\
    }} }} while (0)
"""


def stamped(source: str) -> str:
    """The source with the stamps: every edit must apply exactly once."""
    signature = ("const Params& p, uint32_t phase", "const Params& p, uint32_t phase, int phase_step")
    call = ("seq, p, (i / 2) & 1", "seq, p, (i / 2) & 1, i")
    edits = [("\nnamespace attngen_", PRELUDE + "\nnamespace attngen_"), signature, call,   # query_block learns its step
             ("    for (int i = 0; i < steps; ++i) {\n", "    for (int i = 0; i < steps; ++i) {\n        const int phase_step = i;\n")]
    for text, slot, _ in STAMPS:
        before, _, after = text.partition("|")
        edits.append((before + after, before + f"    PHASE_STAMP({slot});\n" + after))
    for old, new in edits:
        if source.count(old) != 1:
            sys.exit(f"the generated source has {source.count(old)} of {old.strip()!r}; update the stamps")
        source = source.replace(old, new)
    return source


def read_global(kernel, name: str, nbytes: int) -> bytes:
    cuda = ctypes.CDLL("libcuda.so.1")
    ptr, size = ctypes.c_uint64(), ctypes.c_size_t()
    rc = cuda.cuLibraryGetGlobal(ctypes.byref(ptr), ctypes.byref(size), ctypes.c_void_p(kernel.libraries[0]),
                                 name.encode())
    assert rc == 0 and size.value >= nbytes, (rc, size.value)
    torch.cuda.synchronize()
    buf = ctypes.create_string_buffer(nbytes)
    assert cuda.cuMemcpyDtoH_v2(buf, ptr, ctypes.c_size_t(nbytes)) == 0
    zero = cuda.cuMemsetD8_v2(ptr, ctypes.c_ubyte(0), ctypes.c_size_t(nbytes))
    assert zero == 0
    return buf.raw


def phases(raw: bytes):
    """Median cycles of each phase (from the previous stamp present to this one), of the loop back
    (the last stamp of a step to the next step's first) and of a whole step."""
    import array
    clk = array.array("Q", raw)
    order = [slot for _, slot, _ in STAMPS]
    names = {slot: name for _, slot, name in STAMPS}
    per_phase = {slot: [] for slot in order}
    per_step, loop_back = [], []
    for walk in range(1024 * 2):
        base = walk * MAX_STEPS * SLOTS
        steps = [clk[base + s * SLOTS: base + (s + 1) * SLOTS] for s in range(MAX_STEPS)]
        steps = [[(slot, s[slot]) for slot in order if s[slot]] for s in steps]
        steps = [s for s in steps if s]
        for a, b in zip(steps, steps[1:]):
            per_step.append(b[0][1] - a[0][1])
            loop_back.append(b[0][1] - a[-1][1])
        for s in steps:
            for (_, t0), (slot, t1) in zip(s, s[1:]):
                per_phase[slot].append(t1 - t0)
    out = {names[k]: statistics.median(v) for k, v in per_phase.items() if v}
    out["loop back (last stamp to the next loop top)"] = statistics.median(loop_back) if loop_back else None
    out["step (loop top to loop top)"] = statistics.median(per_step) if per_step else None
    return out


def main(out_path=None):
    rows = []
    for name, d in (("h100_bwd_d128_wgmma", 128), ("h100_bwd_d64_wgmma", 64)):
        base = attngen.load(f"specs/{name}.yaml")
        sources = list(base.sources)
        sources[0] = stamped(sources[0])
        probe = type(base).from_sources(base.plan, sources, label=f"{name}_stamped")
        for causal in (False, True):
            torch.manual_seed(0)
            q, k, v, do = (torch.randn(4, 16, 2048, d, device="cuda", dtype=torch.float16) for _ in range(4))
            o, lse = attngen.attention(q, k, v, return_lse=True, causal=causal)
            ref = base(q, k, v, o, lse, do, causal=causal)
            got = probe(q, k, v, o, lse, do, causal=causal)
            diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(got, ref))
            t_base = queued_med(lambda: base(q, k, v, o, lse, do, causal=causal))
            t_probe = queued_med(lambda: probe(q, k, v, o, lse, do, causal=causal))
            read_global(probe, "attngen_phase_clock", 1024 * 2 * MAX_STEPS * SLOTS * 8)   # clear
            probe(q, k, v, o, lse, do, causal=causal)
            cycles = phases(read_global(probe, "attngen_phase_clock", 1024 * 2 * MAX_STEPS * SLOTS * 8))
            row = {"spec": name, "shape": f"4x16x2048x{d}", "causal": causal, "us": t_base,
                   "us_stamped": t_probe, "max_diff_vs_unstamped": diff, "median_cycles": cycles}
            print(json.dumps(row, indent=1), flush=True)
            rows.append(row)
    if out_path:
        Path(out_path).write_text(json.dumps({"command": " ".join(["python3", *sys.argv]),
                                              "device": torch.cuda.get_device_name(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
