"""Where the Hopper backward's time goes: each ablation takes one piece out of the bwd_wgmma main
template (the gradients are then wrong; only the time means anything) and times the call.

Usage: python3 docs/backward-h200/bwd_wgmma_ablation.py [NAME...]     (default: every ablation, `full` first and last)

Each ablation renders the template with one text edit, in a fresh process (its own compile), and
times h100_bwd_d128_wgmma non-causal and causal and h100_bwd_d64_wgmma non-causal at 4x16x2048,
fp16: one call (preprocess + main + convert), `attngen bench`'s queued timing (docs/measurements/gpu_timing.queued_med:
30 calls behind a GPU sleep, the median; until c17ee4e, CUDA events around each call, docs/measurements/gpu_timing.med).
The template is restored afterwards, also on failure.
"""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "templates" / "bwd_wgmma" / "main.cu.j2"
LOAD = "                    load_query_tiles(maps, query_step<kVarlen>(next_head, next_m0, seq, p), seq, smem_addr, (i + 1) % 2);"
ABLATIONS = {   # name: [(text, replacement)]
    "full": [],
    # (the stage's mbarrier still completes its phase: one arrival, no bytes)
    "no_next_load": [(LOAD, "                    mbarrier_arrive(query_bar(smem_addr, (i + 1) % 2));")],
    "no_dq_add": [("    for (int v = 0; v < kDqRegs; ++v) red_add(", "    if (p.seqlen_q < 0) for (int v = 0; v < kDqRegs; ++v) red_add(")],
    "no_dq": [("    issue_dq(dq, sDS, sK, kDqByRows ? kDqRows * warpgroup : 0, kDqByRows ? 0 : kDqCols * warpgroup);", "    for (int v = 0; v < kDqRegs; ++v) dq[v] = 0.f;"),
              ("    add_dq<kMask, kDeterministic>(dq, sQ, st, n0, tid, seq, p);",
               "    if (p.seqlen_q < 0) add_dq<kMask, kDeterministic>(dq, sQ, st, n0, tid, seq, p);")],
    "no_exp2": [("        s[v] = exp2f(log2_probability<kMask, kMasked>(s[v], v, one, sLse, key0, q0, lane, mods, p));",
                 "        s[v] = log2_probability<kMask, kMasked>(s[v], v, one, sLse, key0, q0, lane, mods, p);")],
}
# (Until the Q and dO copies moved to TMA, no_top_barrier and no_block_barriers took the step's top
# block barrier out as well; ds_barrier_per_warpgroup replaced the dS^T barrier with a warpgroup's.
# That barrier, now the step's only one, also keeps thread 0 from re-arming a stage's mbarrier before
# every thread has waited on its last phase: without it a walk can hang, so they are gone.)
TIMER = r'''
import sys, torch, attngen
sys.path.insert(0, "docs/measurements")   # run from the repository root (cwd=ROOT)
from gpu_timing import queued_med as med
out = []
for spec, d, causal in (("h100_bwd_d128_wgmma", 128, False), ("h100_bwd_d128_wgmma", 128, True),
                        ("h100_bwd_d64_wgmma", 64, False)):
    k = attngen.load(f"specs/{spec}.yaml")
    torch.manual_seed(0)
    q, kk, v, do, o = (torch.randn(4, 16, 2048, d, device="cuda").half() for _ in range(5))
    lse = torch.randn(4, 16, 2048, device="cuda") + 10
    out.append(f"d{d}{' causal' if causal else ''} {med(lambda: k(q, kk, v, o, lse, do, causal=causal)):.0f} us")
print(sys.argv[1].ljust(26), "  ".join(out), flush=True)
'''


def main(names):
    base = TEMPLATE.read_text()
    try:
        for name in names:
            text = base
            for old, new in ABLATIONS[name]:
                if old not in text:
                    sys.exit(f"{name}: the template no longer has {old.strip()!r}; update the ablation")
                text = text.replace(old, new, 1)
            TEMPLATE.write_text(text)
            run = subprocess.run([sys.executable, "-c", TIMER, name], cwd=ROOT, capture_output=True, text=True)
            print(run.stdout.strip() if run.returncode == 0 else f"{name}: failed\n{run.stderr[-800:]}", flush=True)
    finally:
        TEMPLATE.write_text(base)


if __name__ == "__main__":
    main(sys.argv[1:] or ["full", *[n for n in ABLATIONS if n != "full"], "full"])
