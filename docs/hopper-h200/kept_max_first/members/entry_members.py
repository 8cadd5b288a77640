"""attngen.attention on calls the three kept-max specs now serve, beside the new spec and the cell the table served
before, loaded by path, alternating in one process (GPU us, attngen bench's queued timing, input sets rotated past L2,
median of 3 rounds): the entry point should run at the new spec's time.
Usage (GPU machine, repository root): python3 docs/hopper-h200/kept_max_first/members/entry_members.py OUT.json [next|more]
(next: the three specs made from the trials of run_next.sh, in place of the first three; more: the cells made from
run_more.sh's trials: the d128 window, d192 full masks and the d64 three-warpgroup sink and window cells)"""
from pathlib import Path
import json
import sys

import torch

import attngen
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "measurements"))   # the helpers the scripts share
sys.path.insert(0, str(HERE.parents[1] / "variants_persistent"))
from gpu_timing import alternating_sets
from model_calls import sets_for

S = "specs/h100_wgmma_"
CAUSAL = {"causal": True}
CALLS = (("d128 sinks, causal", 2, 32, 8, 4096, 128, {**CAUSAL, "sinks": True}, "d128_sink_persistent_kmpb_bf16", "d128_sink_persistent_bf16"),
         ("d256 softcap 50, causal", 2, 16, 8, 4096, 256, {**CAUSAL, "softcap": 50.0}, "d256_softcap_persistent_km_bf16", "d256_softcap_persistent_bf16"),
         ("d256, causal", 2, 16, 16, 4096, 256, CAUSAL, "d256_persistent_km_bf16", "d256_persistent_bf16"))
NEXT = (("d128 softcap 50, full", 4, 32, 16, 1024, 128, {"softcap": 50.0}, "d128_softcap_persistent_kmpb_bf16",
         "d128_softcap_persistent_bf16"),
        ("d128 softcap 50, full", 2, 32, 16, 4096, 128, {"softcap": 50.0}, "d128_softcap_persistent_kmpb_bf16", "d128_softcap_bf16"),
        ("d128 sinks, causal window 4095", 1, 32, 8, 8192, 128, {**CAUSAL, "window": (4095, 0), "sinks": True},
         "d128_sink_window_persistent_kmpb_bf16", "d128_sink_bf16"),
        ("d256, full", 1, 16, 16, 16384, 256, {}, "d256_km_bf16", "d256_persistent_bf16"))
WINDOW_1023 = {**CAUSAL, "window": (1023, 0)}
MORE = (("d128, causal window 4095", 1, 32, 8, 8192, 128, {**CAUSAL, "window": (4095, 0)},
         "d128_window_persistent_kmpb_bf16", "d128_window_bf16"),
        ("d128, causal window 4095", 4, 32, 8, 1024, 128, {**CAUSAL, "window": (4095, 0)},
         "d128_window_persistent_kmpb_bf16", "d128_window_persistent_bf16"),
        ("d192, full", 2, 16, 16, 8192, 192, {}, "d192_km_bf16", "d192_bf16"),
        ("d192 v128, full", 2, 16, 16, 8192, (192, 128), {}, "d192_v128_persistent_km_bf16", "d192_v128_bf16"),
        ("d64 sinks, causal", 1, 64, 8, 8192, 64, {**CAUSAL, "sinks": True}, "d64_persistent_q2_c3_sink_lazy_bf16",
         "d64_persistent_q2_c3_sink_bf16"),
        ("d64, causal window 1023", 1, 16, 16, 8192, 64, WINDOW_1023, "d64_persistent_q2_c3_window_lazy_bf16",
         "d64_persistent_q2_c3_window_bf16"))
GROUPS = {"next": NEXT, "more": MORE}
rows, gen = [], torch.Generator(device="cuda")
gen.manual_seed(1)
for label, b, h, hk, s, d, kw, new, old in GROUPS.get(sys.argv[2] if len(sys.argv) > 2 else "", CALLS):
    d, dv = d if isinstance(d, tuple) else (d, d)
    call_kw = dict(kw)
    if kw.get("sinks"):
        call_kw["sinks"] = torch.randn(h, generator=gen, device="cuda")
    sets = sets_for(b, h, hk, s, d, gen, dv=dv)
    fns = {"attngen.attention": lambda q, k, v: attngen.attention(q, k, v, **call_kw)}
    for name in (new, old):
        kernel = attngen.load(f"{S}{name}.yaml")
        fns[name] = lambda q, k, v, kernel=kernel: kernel(q, k, v, **call_kw)
    med, each = alternating_sets({n: (f, sets) for n, f in fns.items()}, 3)
    q, k, v = sets[0]
    same = bool(torch.equal(fns["attngen.attention"](q, k, v), fns[new](q, k, v)))
    row = {"call": label, "shape": f"{b}x{h}/{hk}x{s}x{d}" + (f"x{dv}" if dv != d else ""), "dtype": "bf16", "us": med, "rounds": each,
           "entry_output_equals_new_spec": same}
    rows.append(row)
    print(json.dumps({x: row[x] for x in ("call", "shape", "us", "entry_output_equals_new_spec")}), flush=True)
    sets = None
    torch.cuda.empty_cache()
Path(sys.argv[1]).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                         "rows": rows}, indent=1) + "\n")
