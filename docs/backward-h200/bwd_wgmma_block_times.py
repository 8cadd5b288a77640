"""Where a Hopper backward block's time goes outside its steps, by clock stamps: the first thread of
each block writes clock64 at its entry, after the prologue's barrier (K and V landed, the first Q and
dO issued), after the walk and after the epilogue's stores (behind one more block barrier), with its
SM's id. Blocks that ran one after another on one SM give the gap between them: the time from the
last block's end to the next one's first instruction (its stores' drain, the launch of the next).

Usage: python3 docs/backward-h200/bwd_wgmma_block_times.py [OUT.json] [SPEC ...]   (default h100_bwd_d128_wgmma)

The stamps are text edits of the spec's generated main source, compiled beside the untouched
kernel; both are timed (`attngen bench`'s queued timing). Shapes: 4x16x2048 and 1x16x8192 at the
spec's head dim and dtype, causal and not. The epilogue's figure includes the wait at its block
barrier for the other warps' last step. Prints the median cycles of each part and their sum over a
block's life as a share of the SM's busy time.
"""
from pathlib import Path
import array
import json
import statistics
import sys

import torch

import attngen
from bwd_wgmma_phases import read_global
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from gpu_timing import queued_med, write_report

MAX_BLOCKS = 4096
SLOTS = 6   # entry, prologue done, walk done, epilogue done, SM id, (unused)
STAMPS = [   # (text after which the stamp goes, slot)
    ("    const uint32_t smem_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));\n", 0),
    ("    __syncthreads();               // K, V, the first step's statistics and the mbarriers' initialisation\n", 1),
    ("        m0 = next_m0;\n    }\n", 2),
]
TAIL = "kv_head, p);\n}\n\ntemplate <Mask kMask, bool kDeterministic>\n__device__ __forceinline__ void attention_backward("
END = (TAIL, "kv_head, p);\n    __syncthreads();\n    BLOCK_STAMP(3);\n"
       "    if (threadIdx.x == 0 && block_id_() < %d) { unsigned s_; asm volatile(\"mov.u32 %%0, %%%%smid;\" : \"=r\"(s_));"
       " attngen_block_clock[block_id_() * %d + 4] = s_; }\n}\n" % (MAX_BLOCKS, SLOTS) + TAIL.split("}\n", 1)[1])
PRELUDE = f"""
__device__ unsigned long long attngen_block_clock[{MAX_BLOCKS} * {SLOTS}];
__device__ __forceinline__ unsigned block_id_() {{ return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z); }}
#define BLOCK_STAMP(k) do {{ if (threadIdx.x == 0 && block_id_() < {MAX_BLOCKS}) {{ \\
    unsigned long long t_; asm volatile("mov.u64 %0, %%clock64;" : "=l"(t_) :: "memory"); \\
    attngen_block_clock[block_id_() * {SLOTS} + (k)] = t_; }} }} while (0)
"""


def stamped(source: str) -> str:
    edits = [("\nnamespace attngen_", PRELUDE + "\nnamespace attngen_"), END]
    edits += [(text, text + f"    BLOCK_STAMP({slot});\n") for text, slot in STAMPS]
    for old, new in edits:
        if source.count(old) != 1:
            sys.exit(f"the generated source has {source.count(old)} of {old.strip()!r}; update the stamps")
        source = source.replace(old, new)
    return source


def block_parts(raw: bytes, blocks: int) -> dict:
    clk = array.array("Q", raw)
    rows = [clk[b * SLOTS:(b + 1) * SLOTS] for b in range(min(blocks, MAX_BLOCKS))]
    rows = [r for r in rows if r[3]]
    prologue = [r[1] - r[0] for r in rows]
    walk = [r[2] - r[1] for r in rows]
    epilogue = [r[3] - r[2] for r in rows]
    by_sm = {}
    for r in rows:
        by_sm.setdefault(r[4], []).append(r)
    gaps, busy, first_to_last = [], 0, 0
    for sm_rows in by_sm.values():
        sm_rows.sort(key=lambda r: r[0])
        gaps += [b[0] - a[3] for a, b in zip(sm_rows, sm_rows[1:])]
        first_to_last += sm_rows[-1][3] - sm_rows[0][0]
        busy += sum(r[3] - r[0] for r in sm_rows)
    med = statistics.median
    return {"blocks": len(rows), "sms": len(by_sm), "prologue": med(prologue), "walk": med(walk),
            "epilogue": med(epilogue), "gap_between_blocks": med(gaps) if gaps else None,
            "gap_mean": statistics.mean(gaps) if gaps else None,
            "share_outside_walk": 1 - sum(walk) / max(first_to_last, 1),
            "mean_blocks_per_sm": len(rows) / max(len(by_sm), 1)}


def main(out_path=None, *specs):
    rows = []
    for name in specs or ("h100_bwd_d128_wgmma",):
        base = attngen.load(f"specs/{name}.yaml")
        d = base.plan.head_dim
        sources = list(base.sources)
        sources[0] = stamped(sources[0])
        probe = type(base).from_sources(base.plan, sources, label=f"{name}_block_stamped")
        for b, h, s in ((4, 16, 2048), (1, 16, 8192)):
            for causal in (False, True):
                torch.manual_seed(0)
                dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[base.plan.spec.dtype]
                q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(4))
                o, lse = attngen.attention(q, k, v, return_lse=True, causal=causal)
                ref = base(q, k, v, o, lse, do, causal=causal)
                got = probe(q, k, v, o, lse, do, causal=causal)
                diff = max((x.float() - y.float()).abs().max().item() for x, y in zip(got, ref))
                t_base = queued_med(lambda: base(q, k, v, o, lse, do, causal=causal))
                t_probe = queued_med(lambda: probe(q, k, v, o, lse, do, causal=causal))
                nbytes = MAX_BLOCKS * SLOTS * 8
                read_global(probe, "attngen_block_clock", nbytes)   # clear
                probe(q, k, v, o, lse, do, causal=causal)
                parts = block_parts(read_global(probe, "attngen_block_clock", nbytes), MAX_BLOCKS)
                row = {"spec": name, "shape": f"{b}x{h}x{s}x{d}", "causal": causal, "us": t_base,
                       "us_stamped": t_probe, "max_diff_vs_unstamped": diff, "median_cycles": parts}
                print(json.dumps(row), flush=True)
                rows.append(row)
    if out_path:
        write_report(out_path, rows)


if __name__ == "__main__":
    main(*sys.argv[1:])
