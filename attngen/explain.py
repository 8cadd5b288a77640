"""Human-readable description of a Plan (what `attngen explain` prints)."""
from __future__ import annotations

from .plan import Plan


def kib(n: int) -> str:
    return f"{n / 1024:.2f} KiB"


def explain(plan: Plan, regs_per_thread: int | None = None) -> str:
    s, t = plan.spec, plan.target
    out = [f"{s.name}: {s.mma} attention forward, {s.dtype}, head_dim {plan.head_dim}, "
           f"masks {', '.join(plan.masks)}",
           f"target {t.name} ({t.gpu}, {t.arch}); functions: {', '.join(fn for _, fn in plan.functions)}",
           "",
           f"block: {plan.block_m} query rows x {plan.block_n}-key K/V tiles; grid (ceil(seqlen_q / {plan.block_m}), "
           f"heads, batch)",
           f"threads: {plan.threads} = {plan.compute_warps} compute warp(s)"
           + (f" + {plan.producer_warps} producer warp(s)" if plan.producer_warps else "")
           + f"; each compute warp owns {plan.rows_per_warp} query rows"]
    if plan.family == "mma":
        m = plan.mma
        out.append(f"fragments per warp: {m['m_tiles']} x m16 rows; S = {m['m_tiles']}x{m['n_tiles']} m16n8 tiles "
                   f"({m['s_regs']} fp32 regs), O = {m['m_tiles']}x{m['d_tiles']} tiles ({m['o_regs']} fp32 regs)"
                   + (f", Q fragments {m['q_regs']} regs" if m["q_regs"] else ", Q re-read from shared memory")
                   + f"; ~{m['est_regs']} accumulator registers per thread")
        out.append(f"mma.sync per tile per warp: {m['m_tiles'] * m['n_tiles'] * m['k_steps_qk']} (Q.K^T) + "
                   f"{m['m_tiles'] * m['d_tiles'] * m['k_steps_pv']} (P.V)")
    elif plan.family == "wmma":
        w = plan.wmma
        out.append(f"wmma 16x16x16 per warp: {w['m_tiles']} row tile(s); S, P and O staged in shared memory; "
                   f"{w['lanes_per_row']} lanes per softmax row")
    else:
        sc = plan.scalar
        out.append(f"scalar: each lane owns {sc['keys_per_lane']} key(s) of S and {sc['pairs_per_lane']} column "
                   f"pair(s) of O per row")
    pipeline = (f"K/V pipeline: {plan.stages} stage(s), {'cp.async 16 B' if plan.async_copy else 'synchronous 16-B loads'}"
                f"; Q {'kept in registers' if plan.q_in_registers else 'in shared memory'}")
    out.append(pipeline)
    if plan.family != "scalar":
        out.append(f"online softmax: exp2 with the scale folded in; rescale {plan.rescale.replace('_', ' ')}")
    out += ["", "shared memory:", f"  {'region':<7} {'offset':>7} {'bytes':>7} {'KiB':>7}  {'shape':<16} {'pitch':>6}  "
            f"{'layout':<28} purpose"]
    for r in plan.regions:
        out.append(f"  {r.name:<7} {r.offset:>7} {r.bytes:>7} {r.bytes / 1024:>7.2f}  "
                   f"{f'{r.rows}x{r.cols} {r.elem}':<16} {r.pitch_bytes:>6}  {r.swizzle:<28} {r.per}")
    used = plan.smem_bytes
    out.append(f"  total {used} B ({kib(used)}) of {plan.smem_budget} B ({kib(plan.smem_budget)}) budget, "
               f"{100 * used / plan.smem_budget:.0f}%; "
               f"{'dynamic (opt-in attribute raised at launch)' if plan.smem_dynamic else 'static'}")
    if plan.barriers:
        out += ["", "warp roles and mbarriers (region bars):",
                f"  producer warps {plan.compute_warps}..{plan.compute_warps + plan.producer_warps - 1} "
                f"(threads {plan.compute_threads}..{plan.threads - 1}) copy K/V tile t into stage t % {plan.stages}",
                f"  consumer warps 0..{plan.compute_warps - 1} compute tile t from stage t % {plan.stages}"]
        for b in plan.barriers:
            out.append(f"  {b.name:<7} smem +{b.offset:<6} {b.arrivals:>4} arrivals per phase from {b.arrive}; "
                       f"{b.wait} wait")
        out += ["  schedule, tile t in stage s = t % stages, phase t / stages (waiters test its parity):",
                "    producer: wait empty[s] (when t >= stages), issue cp.async of K and V tile t,"
                " cp.async.mbarrier.arrive on full[s], go on without waiting for the copies",
                "    consumer: wait full[s], compute tile t, arrive empty[s]",
                f"  up to {plan.stages} tiles in flight; thread 0 initialises the mbarriers, and the Q copy's"
                " __syncthreads (the kernel's only block-wide barrier) publishes them"]
    out += ["", "shared-memory bank conflicts (worst wavefronts per phase; 1 = conflict-free):"]
    for p in plan.bank_report:
        flag = "conflict-free" if p.degree == 1 else f"{p.degree}-way conflict"
        out.append(f"  {p.name:<52} {p.degree:>2}  {flag}")
    if plan.min_blocks_per_sm:
        out += ["", f"launch bounds: {plan.threads} threads, at least {plan.min_blocks_per_sm} block(s) per SM: ptxas "
                    f"caps registers at "
                    f"{min(255, plan.target.regs_per_sm // (plan.min_blocks_per_sm * plan.threads))} per thread"]
    by_smem = plan.blocks_per_sm_by_smem()
    out += ["", f"resident blocks per SM on {t.name}: {by_smem} by shared memory and threads"
                + (f", {plan.blocks_per_sm_by_registers(regs_per_thread)} by registers ({regs_per_thread}/thread)"
                   if regs_per_thread else " (compile to see the register limit)")]
    return "\n".join(out)


def plan_dict(plan: Plan) -> dict:
    """JSON-ready form of a plan for `explain --json`."""
    return {
        "name": plan.spec.name, "family": plan.family, "target": plan.target.name, "arch": plan.target.arch,
        "dtype": plan.spec.dtype, "head_dim": plan.head_dim, "block_m": plan.block_m, "block_n": plan.block_n,
        "threads": plan.threads, "compute_warps": plan.compute_warps, "producer_warps": plan.producer_warps,
        "rows_per_warp": plan.rows_per_warp, "stages": plan.stages, "async_copy": plan.async_copy,
        "functions": dict(plan.functions),
        "regions": [{"name": r.name, "offset": r.offset, "bytes": r.bytes, "rows": r.rows, "cols": r.cols,
                     "elem": r.elem, "pitch_bytes": r.pitch_bytes, "swizzle": r.swizzle} for r in plan.regions],
        "smem_bytes": plan.smem_bytes, "smem_budget": plan.smem_budget, "smem_dynamic": plan.smem_dynamic,
        "barriers": [b.__dict__ for b in plan.barriers],
        "bank_conflicts": [{"pattern": p.name, "degree": p.degree} for p in plan.bank_report],
        "blocks_per_sm_by_smem": plan.blocks_per_sm_by_smem(),
        "fragments": plan.mma or plan.wmma or plan.scalar,
    }
