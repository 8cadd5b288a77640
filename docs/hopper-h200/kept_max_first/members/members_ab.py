"""The kept-max cells that became specs beside the cells the table served before on the same calls, alternating in
one process: d128 sinks (h100_wgmma_d128_sink_persistent_kmpb against sink_persistent and the sink cell), d256
softcap (softcap_persistent_km against softcap_persistent) and d256 causal (persistent_km against persistent and
persistent_n64), causal and with a causal window of 4095, in bf16 and fp16. GPU us (attngen bench's queued timing,
input sets rotated past L2), median of 3 rounds, and the largest difference from the first cell's output
(`attngen verify` checks each cell against fp32).
Usage (GPU machine, repository root): python3 docs/hopper-h200/kept_max_first/members/members_ab.py OUT.json [next|causal_long|window|alibi|d192|d64|dims]
(next: the full-mask trials of NEXT instead; causal_long: d256 causal from 8192 keys, CAUSAL_LONG; window: the d128
window trials of window/, WINDOWS; alibi: ALIBIS; d192: the d192 trials of d192/, D192S; d64: the lazy_rescale trials of d64/, D64S;
dims: the d32, d40, d80 and d160 trials of dims/, DIMS)"""
from pathlib import Path
import json
import sys

import torch

import attngen
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "measurements"))   # the helpers the scripts share
from gpu_timing import alternating_sets
sys.path.insert(0, str(HERE.parents[1] / "variants_persistent"))
from model_calls import sets_for

S = "specs/h100_wgmma_"
SINK = ("d128 sinks", 128, 32, 8, {"sinks": True}, ("d128_sink_persistent", "d128_sink_persistent_kmpb", "d128_sink"))
CAP = ("d256 softcap 50", 256, 16, 8, {"softcap": 50.0}, ("d256_softcap_persistent", "d256_softcap_persistent_km"))
PLAIN = ("d256", 256, 16, 16, {}, ("d256_persistent", "d256_persistent_km", "d256_persistent_n64"))
CAUSAL = ((8, 512), (4, 1024), (4, 2048), (2, 4096), (1, 8192), (1, 16384))
WINDOW = ((2, 4096), (1, 8192), (1, 16384))
# (members/h100/members_ab.json also has the d128 sinks with a causal window of 4095, timed while the kmpb spec had a
# window function: it spilled, so the spec is causal only and that group is gone from here)
GROUPS = [(SINK, "causal", CAUSAL), (CAP, "causal", CAUSAL),
          (CAP, "causal window 4095", WINDOW), (PLAIN, "causal", ((16, 1024), (4, 2048), (2, 4096), (2, 8192), (1, 16384)))]
# `next`: full masks, the trials not yet specs (the fp16 ones in next/, the bf16 ones in ../other_cells/) beside the
# cells the table served there when it was written: d128 softcap (softcap_persistent to 2896 keys, softcap past it),
# d256 (persistent to 2896 keys, the base cell past it); two of them have been specs since (README, "The trials")
CAP_FULL = ("d128 softcap 50", 128, 32, 16, {"softcap": 50.0},
            ("d128_softcap", "trial:t_d128_softcap_persistent_kmpb", "d128_softcap_persistent"))
PLAIN_FULL = ("d256", 256, 16, 16, {}, ("d256", "trial:t_d256_km", "d256_persistent"))
FULL = ((4, 2048), (2, 4096), (2, 8192), (1, 16384))
# and d128 sinks with a window: the kept max without the 12 B of spills of two Q tiles and two P buffers there
SINK_WINDOW = ("d128 sinks", 128, 32, 8, {"sinks": True},
               ("d128_sink_persistent", "trial:t_d128_sink_window_q1pb", "trial:t_d128_sink_window_km", "d128_sink"))
NEXT = [(CAP_FULL, "full", FULL), (PLAIN_FULL, "full", FULL), (SINK_WINDOW, "causal window 4095", WINDOW)]
# `causal_long`: d256 causal at 8192-16384 keys, where the persistent cell serves: the base cell with a kept max
# (1.061x persistent at 1x16x16384 bf16 in members/h100/d256_full_cudnn.json, 0.976x at 2x16x8192) beside it
PLAIN_CAUSAL = ("d256", 256, 16, 16, {}, ("d256_persistent", "trial:t_d256_km_causal", "d256_persistent_km"))
CAUSAL_LONG = [(PLAIN_CAUSAL, "causal", ((2, 8192), (1, 16384)))]
# `window`: the plain d128 window (Mistral's 4095 keys at 32/8 heads, Gemma 3 27B's local 1023 at 32/16) and Gemma 2
# 27B's local softcap window, whose cells have no kept max yet: window_persistent (served to 5792 keys), the window
# cell (past it) and softcap_persistent beside the trials of window/
WIN_NAMES = ("d128_window_persistent", "trial:t_d128_window_kmpb", "trial:t_d128_window_q1pb", "trial:t_d128_window_km",
             "d128_window")
WIN_MISTRAL = ("d128", 128, 32, 8, {}, WIN_NAMES)
WIN_GEMMA3 = ("d128", 128, 32, 16, {}, WIN_NAMES)
CAP_WIN = ("d128 softcap 50", 128, 32, 16, {"softcap": 50.0},
           ("d128_softcap_persistent", "trial:t_d128_softcap_window_kmpb", "trial:t_d128_softcap_window_q1pb"))
# and d256's plain window (Gemma 3 12B's local layers: 16/8 heads, 1023 keys), served by window_persistent
WIN_D256 = ("d256", 256, 16, 8, {}, ("d256_window_persistent", "trial:t_d256_window_persistent_km"))
WINDOWS = [(WIN_MISTRAL, "causal window 4095", ((4, 1024), (4, 2048), (2, 4096), (1, 8192), (1, 16384))),
           (WIN_GEMMA3, "causal window 1023", ((4, 2048), (2, 4096), (1, 8192), (1, 16384))),
           (CAP_WIN, "causal window 4095", ((2, 4096), (1, 8192), (1, 16384))),
           (WIN_D256, "causal window 1023", ((4, 2048), (2, 4096), (1, 8192), (1, 16384)))]
# `alibi`: the d128 ALiBi cell (the ping-pong tiles; it serves every ALiBi mask) beside its trial with a kept max, on
# 32 heads of their own with the usual slopes 2^(-8 i / 32)
ALIBI = ("d128 alibi", 128, 32, 32, {"alibi": True}, ("d128_alibi", "trial:t_d128_alibi_km"))
ALIBIS = [(ALIBI, "causal", ((4, 2048), (2, 4096), (1, 8192))), (ALIBI, "full", ((4, 2048), (2, 4096))),
          (ALIBI, "causal window 4095", ((1, 8192),))]
# `d64`: the three-warpgroup d64 cells with softmax.lazy_rescale alone (1.003-1.060x on the base cell in an H100 run):
# gpt-oss's sinks (64/8 heads) causal and with a 4095-key window, the plain window of 1023 keys, causal and full
C3_SINK = ("d64 sinks", 64, 64, 8, {"sinks": True}, ("d64_persistent_q2_c3_sink", "trial:t_d64_c3_sink_lazy"))
C3_WINDOW = ("d64", 64, 16, 16, {}, ("d64_persistent_q2_c3_window", "trial:t_d64_c3_window_lazy"))
C3 = ("d64", 64, 16, 16, {}, ("d64_persistent_q2_c3", "trial:t_d64_c3_lazy"))
D64S = [(C3_SINK, "causal", ((2, 2048), (1, 4096), (1, 8192), (1, 16384))),
        (C3_SINK, "causal window 4095", ((1, 8192), (1, 16384))),
        (C3_WINDOW, "causal window 1023", ((8, 512), (4, 2048), (1, 8192), (1, 16384))),
        (C3, "causal", ((8, 2048), (4, 4096), (2, 8192), (1, 16384))), (C3, "full", ((4, 4096), (2, 8192), (1, 16384)))]
# `d192`: the d192 cells (Q and K 192 wide; V 192, or 128 as MLA's prefill) with a kept max, the base cells and the
# persistent ones, beside the cells the table serves (persistent to 11585 keys causal and 2896 full; then the base
# cell, or n96 in fp16 at d192)
D192 = ("d192", 192, 16, 16, {}, ("d192_persistent", "trial:t_d192_persistent_km", "d192", "trial:t_d192_km", "d192_n96"))
D192_V128 = ("d192 v128", (192, 128), 16, 16, {},
             ("d192_v128_persistent", "trial:t_d192_v128_persistent_km", "d192_v128", "trial:t_d192_v128_km"))
D192_SHAPES = ((4, 2048), (2, 4096), (2, 8192), (1, 16384))
D192S = [(D192, "causal", D192_SHAPES), (D192, "full", D192_SHAPES),
         (D192_V128, "causal", D192_SHAPES), (D192_V128, "full", D192_SHAPES)]
# `dims`: the other head dims' base cells (the table serves them at every length) with a kept max where it does not
# spill (d32, d40: three consumer warpgroups at 160 registers; at d80 it spilled 32-88 B, at d160 4-8 B) and with
# softmax.lazy_rescale alone (dims/), 16 heads
DIM_SHAPES = ((8, 1024), (4, 2048), (2, 8192), (1, 16384))
DIMS = [((f"d{d}", d, 16, 16, {}, (f"d{d}",) + tuple(f"trial:t_d{d}_{t}" for t in trials)), mask, DIM_SHAPES)
        for d, trials in ((32, ("km", "lazy")), (40, ("km", "lazy")), (80, ("lazy",)), (160, ("lazy",)))
        for mask in ("causal", "full")]


def spec_path(name: str, suffix: str) -> str:
    """A committed cell's file, or a trial's ("trial:NAME": in next/, window/, d192/, d64/ or dims/, else the bf16
    ones of ../other_cells/)."""
    if name.startswith("trial:"):
        file = f"{name[6:]}{suffix}.yaml"
        return str(next((p for p in (HERE / sub / file for sub in ("next", "window", "d192", "d64", "dims")) if p.exists()),
                        HERE.parent / "other_cells" / file))
    lab = Path(f"specs/lab/h100_wgmma_{name}.yaml")     # a cell the table no longer serves (d192_n96)
    return f"specs/lab/h100_wgmma_{name}{suffix}.yaml" if lab.exists() else f"{S}{name}{suffix}.yaml"


def main(report: str, groups=GROUPS) -> None:
    rows, gen = [], torch.Generator(device="cuda")
    gen.manual_seed(0)
    for dtype, suffix in ((torch.bfloat16, "_bf16"), (torch.float16, "")):
        for (label, d, h, hk, kw, names), mask, shapes in groups:
            cells = {n: attngen.load(spec_path(n, suffix)) for n in names}
            for b, s in shapes:
                call_kw = {"causal": mask != "full", **kw}
                if mask.startswith("causal window"):
                    call_kw["window"] = (int(mask.split()[-1]), 0)
                if kw.get("sinks"):
                    call_kw["sinks"] = torch.randn(h, generator=gen, device="cuda")
                if call_kw.pop("alibi", False):
                    call_kw["alibi_slopes"] = torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)], device="cuda")
                d_qk, dv = d if isinstance(d, tuple) else (d, d)
                sets = sets_for(b, h, hk, s, d_qk, gen, dtype, dv)
                calls = {n: ((lambda q, k_, v, k=k: k(q, k_, v, **call_kw)), sets) for n, k in cells.items()}
                med, each = alternating_sets(calls, 3)
                q, k_, v = sets[0]
                out = {n: fn(q, k_, v).float() for n, (fn, _) in calls.items()}
                first = out[names[0]]
                shape = f"{b}x{h}/{hk}x{s}x{d_qk}" + (f"x{dv}" if dv != d_qk else "")
                row = {"call": f"{label}, {mask}", "dtype": str(dtype).split(".")[1], "shape": shape,
                       "us": med, "rounds": each, f"{names[0]}_over_{names[1]}": med[names[0]] / med[names[1]],
                       "max_diff": {n: float((o - first).abs().max()) for n, o in out.items() if n != names[0]}}
                rows.append(row)
                print(json.dumps({x: row[x] for x in ("call", "dtype", "shape", "us", f"{names[0]}_over_{names[1]}")}),
                      flush=True)
                sets = out = first = None
                torch.cuda.empty_cache()
    Path(report).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                        "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], {"next": NEXT, "causal_long": CAUSAL_LONG, "window": WINDOWS, "alibi": ALIBIS, "d192": D192S, "d64": D64S, "dims": DIMS}[sys.argv[2]] if sys.argv[2:] else GROUPS)
