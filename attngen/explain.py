"""Human-readable description of a plan: what `attngen explain` prints and every generated header
carries. Generic sections (block, layout, roles and mbarriers, bank conflicts, occupancy) come from
the plan's shared numbers; the kind adds its own section."""
from __future__ import annotations

from dataclasses import asdict, is_dataclass

from .core.expression_variant import later_rows_see_more, sample_classes
from .core.launch_rules import AWAITING_TWIN_MAX_SCORES
from .plan import Plan


def kib(n: int) -> str:
    return f"{n / 1024:.2f} KiB"


def roles_and_barriers(plan: Plan) -> list[str]:
    """Roles, every mbarrier and the schedule of a plan whose warps hand work over or that states a schedule
    (nothing otherwise)."""
    if not plan.barriers and not plan.schedule:
        return []
    heading = "warp roles and mbarriers (region bars):" if plan.barriers else "warp roles and schedule:"
    out = [heading] + [f"  {line}" for line in plan.roles]
    for b in plan.barriers:
        out.append(f"  {b.name:<7} smem +{b.offset:<6} {b.arrivals:>4} arrivals per phase from {b.arrive}; "
                   f"{b.wait} wait")
    return out + [f"  {line}" for line in plan.schedule]


def awaiting_twin_lines(plan: Plan) -> list[str]:
    """The entry part's awaiting twins and when a call launches one (none without them)."""
    twins = plan.parts[0].awaiting_twins
    if not twins:
        return []
    return [f"awaiting twins: {', '.join(fn for _, fn in twins)}; launched as programmatic dependents (sm_90 and up) "
            f"for calls of at most {AWAITING_TWIN_MAX_SCORES:,} scores (batch x heads x seqlen_q x seqlen_k, halved "
            "when causal), the usual function for longer ones"]


def explain(plan: Plan, regs_per_thread: int | None = None) -> str:
    s, t = plan.spec, plan.target
    kind = plan.kind
    scores = getattr(plan, "score_variants", ())
    out = [f"{s.name}: {kind.name} ({kind.title}), {s.dtype}, head_dim {plan.head_dim}, "
           f"masks {', '.join(plan.masks)}" + (f", scores {', '.join(v.name for v in scores)}" if scores else ""),
           f"target {t.name} ({t.gpu}, {t.arch}); functions: {', '.join(fn for _, fn in plan.functions)}",
           *awaiting_twin_lines(plan),
           ""]
    padded = getattr(s, "padded", True)     # false: varlen: only, no padded function
    forward = [f"block: {plan.block_m} query rows x {plan.block_n}-key K/V tiles; "
               + (f"grid (ceil(seqlen_q / {plan.block_m}), heads, batch)" if padded else "varlen calls only")
               + ("; varlen sequences (*_varlen): grid (ceil(max_seqlen_q / "
                  f"{plan.block_m}), heads, sequences), sequences longest first, a block past its sequence's rows returns at once"
                  if plan.varlen else ""),
               f"threads: {plan.threads} = {plan.compute_warps} compute warp(s)"
               + (f" + {plan.producer_warps} producer warp(s)" if plan.producer_warps else "")
               + f"; each compute warp owns {plan.rows_per_warp} query rows",
               "masks: " + "; ".join(f"{m.name}: {m.describe}" for m in plan.mask_variants)]
    block = list(plan.block_text) or forward
    out += block[:-1]
    out += kind.explain(plan)
    out.append(getattr(plan, "pipeline_text", "") or
               f"K/V pipeline: {plan.stages} stage(s), "
               f"{plan.copy_engine or ('cp.async 16 B' if plan.async_copy else 'synchronous 16-B loads')}"
               f"; Q {'kept in registers' if plan.q_in_registers else 'in shared memory'}")
    out.append(block[-1])
    if scores:
        out.append("scores (every function, before the mask, in this order): " + "; ".join(
            f"{v.name}: {v.describe} (the call passes {v.argument}=)" for v in scores))
    out += plan.expression_lines()
    out += ["", "shared memory:", f"  {'region':<7} {'offset':>7} {'bytes':>7} {'KiB':>7}  {'shape':<16} {'pitch':>6}  "
            f"{'layout':<28} purpose"]
    for r in plan.regions:
        out.append(f"  {r.name:<7} {r.offset:>7} {r.bytes:>7} {r.bytes / 1024:>7.2f}  "
                   f"{f'{r.rows}x{r.cols} {r.elem}':<16} {r.pitch_bytes:>6}  {r.swizzle:<28} {r.per}")
    used = plan.smem_bytes
    out.append(f"  total {used} B ({kib(used)}) of {plan.smem_budget} B ({kib(plan.smem_budget)}) budget, "
               f"{100 * used / plan.smem_budget:.0f}%")
    out.append(f"  {plan.smem_note}")
    roles = roles_and_barriers(plan)
    if roles:
        out += [""] + roles
    out += ["", f"kernel parameters ({plan.abi.name}, {plan.abi.size} B by value):"]
    for f, offset in plan.abi.rows():
        out.append(f"  +{offset:<4} {f.ctype + ('[%d]' % f.array if f.array else ''):<14} {f.name:<16} {f.meaning}")
    out += ["", "shared-memory bank conflicts (worst wavefronts per phase; 1 = conflict-free):"]
    for p in plan.bank_report:
        flag = "conflict-free" if p.degree == 1 else f"{p.degree}-way conflict"
        out.append(f"  {p.name:<52} {p.degree:>2}  {flag}")
    if getattr(plan, "swizzle_hint", ""):
        out.append(f"  smem.swizzle: {plan.swizzle_hint} makes every access above conflict-free")
    occ = plan.occupancy
    if plan.min_blocks_per_sm:
        out += ["", f"launch bounds: {plan.threads} threads, at least {plan.min_blocks_per_sm} block(s) per SM: ptxas "
                    f"caps registers at {occ.register_cap(plan.min_blocks_per_sm)} per thread"]
    out += ["", f"resident blocks per SM on {t.name}: {occ.by_smem()} by shared memory and threads"
                + (f", {occ.by_registers(regs_per_thread)} by registers ({regs_per_thread}/thread)"
                   if regs_per_thread else " (compile to see the register limit)")]
    return "\n".join(out)


def expression_dict(expression, block_m: int, block_n: int) -> dict | None:
    """An expression spec's variant for `explain --json`: its params, texts, and the classification
    of the sample problem explain prints (None without one)."""
    if expression is None:
        return None
    out = {"params": dict(expression.params),
           "mask": expression.mask.text if expression.mask is not None else None,
           "score": expression.score.text if expression.score is not None else None}
    if expression.mask is not None:
        classes = [c for row in sample_classes(expression, block_m, block_n) for c in row]
        out["sample_4096"] = {c: classes.count(c) for c in ("empty", "full", "partial")}
        out["later_rows_see_more"] = later_rows_see_more(expression, block_m, block_n)
    return out


def plan_dict(plan: Plan) -> dict:
    """JSON-ready form of a plan for `explain --json`."""
    kind = plan.kind
    frag = plan.fragments
    return {
        "name": plan.spec.name, "kind": kind.name, "target": plan.target.name, "arch": plan.target.arch,
        "dtype": plan.spec.dtype, "head_dim": plan.head_dim, "block_m": plan.block_m, "block_n": plan.block_n,
        "threads": plan.threads, "compute_warps": plan.compute_warps, "producer_warps": plan.producer_warps,
        "rows_per_warp": plan.rows_per_warp, "stages": plan.stages, "async_copy": plan.async_copy,
        "functions": [name for _, name in plan.functions],
        "masks": list(plan.masks), "scores": [v.name for v in getattr(plan, "score_variants", ())],
        "expressions": expression_dict(getattr(plan, "expression", None), plan.block_m, plan.block_n),
        "parts": [{"name": p.name, "file": p.file_name, "functions": dict(p.functions),
                   **({"awaiting_twins": dict(p.awaiting_twins)} if p.awaiting_twins else {})} for p in plan.parts],
        "regions": [{"name": r.name, "offset": r.offset, "bytes": r.bytes, "rows": r.rows, "cols": r.cols,
                     "elem": r.elem, "pitch_bytes": r.pitch_bytes, "swizzle": r.swizzle} for r in plan.regions],
        "smem_bytes": plan.smem_bytes, "smem_budget": plan.smem_budget, "smem_dynamic": plan.smem_dynamic,
        "barriers": [asdict(b) for b in plan.barriers],
        "params": [{"name": f.name, "ctype": f.ctype, "offset": o, "size": f.size} for f, o in plan.abi.rows()],
        "params_bytes": plan.abi.size,
        "bank_conflicts": [{"pattern": p.name, "degree": p.degree} for p in plan.bank_report],
        "conflict_free_swizzle": getattr(plan, "swizzle_hint", "") or None,
        "blocks_per_sm_by_smem": plan.occupancy.by_smem(),
        "fragments": asdict(frag) if is_dataclass(frag) else {},
    }
