"""Where a Hopper forward block's time goes at short sequences, by clock stamps: the first warp of
each warpgroup writes clock64 at the phase boundaries of its one query block (plain stores into a
device array, read back afterwards), thread 0 records the SM the block ran on, and the script prints
the median cycles of each phase over every block, the steady cycles per K/V tile, and the gap on
each SM between one block's last stamp and the next block's first (the block switch).

Usage: python3 docs/hopper-h200/fwd_wgmma_phases.py [OUT.json] [SPEC ...]

The stamps are text edits of the generated source (the spec's none/causal functions, not
persistent; default h100_wgmma_d128_n128c2ps2r24x240ppet, the d128 pick up to 4096 keys), compiled
beside the untouched kernel; both are timed (`attngen bench`'s queued timing) so that the stamps'
own cost shows. Shapes: 16x16x512, 8x16x1024 and 4x16x2048 (1024 query blocks of 128 rows each, so
the tiles per block are 4, 8 and 16), fp16, causal and not.
"""
import ctypes
import json
import statistics
import sys
from pathlib import Path

import torch

import attngen
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from gpu_timing import queued_med

BLOCKS = 1024       # blocks whose stamps are kept
ROLES = 3           # warpgroups stamped per block: the consumers, then the producer
ITEMS = 8           # query blocks stamped per block and warpgroup (a persistent block takes several)
SLOTS = 12          # stamps per warpgroup and query block
# (text after which a stamp goes (or, with a "|", where), slot, name of the phase ending there), in
# program order of a consumer warpgroup; the producer's last.
STAMPS = [
    ("    const uint32_t smem_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));\n", 0, "block entry"),
    ("    __syncthreads();  // the only block-wide barrier: every thread sees initialised mbarriers\n", 1,
     "mbarrier init, block barrier"),
    ("        if constexpr (kConsumerRegisters > 0) setmaxnreg_inc<kConsumerRegisters>();\n", 2, "setmaxnreg.inc"),
    ("            mbarrier_wait(smem_addr + kQBar + q_tile * kBarrierBytes, q_phase);\n", 3,
     "wait for Q (TMA)"),
    ("                    wait_k(0);\n", 4, "wait for K_0"),
    ("                    release_k(0);\n", 5, "S_0 = Q.K_0^T (issue, wait)"),
    ("                    p_fragments(pa, s);\n                }\n|                for (int t = 1; t < tiles; ++t) {\n", 6,
     "softmax of S_0, P_0"),
    ("|                if (tiles > 0) {\n                    wait_v(tiles - 1);\n", 7, "tiles 1 .. n-1 (overlapped)"),
    ("                    release_v(tiles - 1);\n                }\n", 8, "last P.V"),
    ("                if constexpr (kLoop) sync_warpgroup(warpgroup);   // the rows were read out\n", 9,
     "epilogue (finish rows, stage O, TMA store issued)"),
    ("        if constexpr (kProducerRegisters > 0) setmaxnreg_dec<kProducerRegisters>();\n", 10,
     "producer: setmaxnreg.dec"),
    ("                    load_block(smem_addr, maps, c, at, ring, t0, n_tiles, q_tile);\n", 11,
     "producer: every TMA load issued (waits on empty stages included)"),
]
CONSUMER_SLOTS = list(range(10))
PRELUDE = f"""
__device__ unsigned long long attngen_phase_clock[{BLOCKS} * {ROLES} * {ITEMS} * {SLOTS}];
__device__ unsigned attngen_phase_sm[{BLOCKS}];
// Warp 0 of each warpgroup: every lane reads the same clock and writes the same slot of its
// phase_item-th query block.
#define PHASE_STAMP(k) do {{ if ((threadIdx.x & 127) < 32) {{ \\
    unsigned long long t_; asm volatile("mov.u64 %0, %%clock64;" : "=l"(t_) :: "memory"); \\
    const unsigned b_ = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z); \\
    if (b_ < {BLOCKS} && phase_item < {ITEMS}) \\
        attngen_phase_clock[((b_ * {ROLES} + threadIdx.x / 128) * {ITEMS} + phase_item) * {SLOTS} + (k)] = t_; \\
    if ((k) == 0 && threadIdx.x == 0 && b_ < {BLOCKS}) {{ unsigned s_; asm volatile("mov.u32 %0, %%smid;" : "=r"(s_)); \\
        attngen_phase_sm[b_] = s_; }} \\
    }} }} while (0)
"""


def stamped(source: str) -> str:
    """The source with the stamps: every edit must apply exactly once."""
    edits = [("\nnamespace attngen_", PRELUDE + "\nnamespace attngen_")]
    for text, slot, _ in STAMPS:
        before, _, after = text.partition("|")
        stamp = f"    PHASE_STAMP({slot});\n"
        if slot == 0:       # the query block a warpgroup is at
            stamp = "    int phase_item = 0;\n" + stamp
        if slot in (9, 11):   # a consumer's, the producer's last stamp of a query block
            stamp += "    ++phase_item;\n"
        edits.append((before + after, before + stamp + after))
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
    assert cuda.cuMemsetD8_v2(ptr, ctypes.c_ubyte(0), ctypes.c_size_t(nbytes)) == 0
    return buf.raw


def phases(raw: bytes, sms: bytes, tiles: int):
    """Median cycles of each consumer phase (from the previous stamp present to this one), of the
    overlapped tiles per tile, of a block (its first stamp to its last), and of the switch on an SM
    from one block's last stamp to the next block's first."""
    import array
    clk, sm = array.array("Q", raw), array.array("I", sms)
    names = {slot: name for _, slot, name in STAMPS}
    per_phase = {slot: [] for slot in CONSUMER_SLOTS[1:]}
    producer, per_block, spans = [], [], []
    for b in range(BLOCKS):
        # rows[r]: warpgroup r's (slot, clock) stamps in program order, query block after query block
        rows = []
        for r in range(ROLES):
            at = (b * ROLES + r) * ITEMS * SLOTS
            rows.append([(k, clk[at + i * SLOTS + k]) for i in range(ITEMS) for k in range(SLOTS)
                         if clk[at + i * SLOTS + k]])
        stamps = [t for row in rows for _, t in row]
        if not stamps:
            continue
        first, last = min(stamps), max(stamps)
        per_block.append(last - first)
        spans.append((sm[b], first, last))
        for row in rows[:ROLES - 1]:
            for (_, t0), (slot, t1) in zip(row, row[1:]):
                if slot in per_phase:
                    per_phase[slot].append(t1 - t0)
        producer += [t1 - t0 for (k0, t0), (k1, t1) in zip(rows[-1], rows[-1][1:]) if k1 == 11]
    out = {names[k]: statistics.median(v) for k, v in per_phase.items() if v}
    if names[7] in out and tiles and tiles > 1:
        out["per overlapped tile"] = out[names[7]] / (tiles - 1)
    out[names[11]] = statistics.median(producer) if producer else None
    out["block (first stamp to last)"] = statistics.median(per_block) if per_block else None
    gaps = []
    by_sm = {}
    for s, first, last in spans:
        by_sm.setdefault(s, []).append((first, last))
    for blocks in by_sm.values():
        blocks.sort()
        gaps += [b[0] - a[1] for a, b in zip(blocks, blocks[1:]) if b[0] > a[1]]
    out["block switch on an SM (last stamp to the next block's first)"] = statistics.median(gaps) if gaps else None
    out["blocks per SM (median)"] = statistics.median(len(v) for v in by_sm.values()) if by_sm else None
    return out


def main(out_path=None, *specs):
    rows = []
    for name in specs or ("h100_wgmma_d128_n128c2ps2r24x240ppet",):
        base = attngen.load(name if name.endswith(".yaml") else f"specs/{name}.yaml")
        d = base.plan.head_dim
        sources = list(base.sources)
        sources[0] = stamped(sources[0])
        probe = type(base).from_sources(base.plan, sources, label=f"{name}_stamped")
        for b, s in ((16, 512), (8, 1024), (4, 2048)):
            for causal in (False, True):
                torch.manual_seed(0)
                q, k, v = (torch.randn(b, 16, s, d, device="cuda", dtype=torch.float16) for _ in range(3))
                ref = base(q, k, v, causal=causal)
                got = probe(q, k, v, causal=causal)
                diff = (got.float() - ref.float()).abs().max().item()
                t_base = queued_med(lambda: base(q, k, v, causal=causal))
                t_probe = queued_med(lambda: probe(q, k, v, causal=causal))
                nbytes = BLOCKS * ROLES * ITEMS * SLOTS * 8
                read_global(probe, "attngen_phase_clock", nbytes)   # clear
                read_global(probe, "attngen_phase_sm", BLOCKS * 4)
                probe(q, k, v, causal=causal)
                raw = read_global(probe, "attngen_phase_clock", nbytes)
                cycles = phases(raw, read_global(probe, "attngen_phase_sm", BLOCKS * 4),
                                None if causal else s // base.plan.block_n)
                row = {"spec": Path(name).stem, "shape": f"{b}x16x{s}x{d}", "causal": causal, "us": t_base,
                       "us_stamped": t_probe, "max_diff_vs_unstamped": diff, "median_cycles": cycles}
                print(json.dumps(row, indent=1), flush=True)
                rows.append(row)
    if out_path:
        Path(out_path).write_text(json.dumps({"command": " ".join(["python3", *sys.argv]),
                                              "device": torch.cuda.get_device_name(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
