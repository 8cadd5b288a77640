"""e4m3 forward specs against their softmax_block trials, alternating in one process (quantized inputs, V^T).
Usage: python3 docs/hopper-h200/softmax_block/fp8_ab.py OUT.json ROUNDS OLD:NEW[,OLD:NEW...] SHAPES"""
import json, sys, statistics
from pathlib import Path
import torch, attngen
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "measurements"))   # the helpers the scripts share
from gpu_timing import alternating
from attngen.runtime.calls.forward_fp8 import quantize_fp8

out, rounds, pairs, shapes = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rows = []
for pair in pairs.split(","):
    old_p, new_p = pair.split(":")
    old, new = attngen.load(old_p), attngen.load(new_p)
    d = old.plan.head_dim
    for shape in shapes.split(","):
        b, h, s, dd = map(int, shape.split("x"))
        if dd != d:
            continue
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(3))
        q8, k8, vt, qd, kd, vd = quantize_fp8(q, k, v)
        for causal in (False, True):
            if causal and "causal" not in new.plan.spec.masks:   # a full-mask cell
                continue
            outs = {}
            def call(kern, name):
                o = torch.empty(q.shape, device="cuda", dtype=kern.out_dtype)
                outs[name] = o
                return lambda: kern(q8, k8, vt, q_descale=qd, k_descale=kd, v_descale=vd, causal=causal, out=o)
            calls = {"old": call(old, "old"), "new": call(new, "new")}
            med, each = alternating(calls, rounds)
            diff = float((outs["old"].float() - outs["new"].float()).abs().max())
            flops = 4 * b * h * s * s * d / (2 if causal else 1)
            row = {"old": old.plan.spec.name, "new": new.plan.spec.name, "shape": shape, "causal": causal,
                   "old_us": med["old"], "new_us": med["new"], "speedup": med["old"] / med["new"],
                   "new_tflops": flops / med["new"] / 1e6, "max_out_diff": diff, "rounds": each}
            print(f"{old.plan.spec.name:45} {shape:14} {'causal' if causal else 'none':6} old {med['old']:8.1f} new {med['new']:8.1f} "
                  f"x{row['speedup']:.3f} {row['new_tflops']:.0f} TF/s diff {diff:.2e}", flush=True)
            rows.append(row)
Path(out).write_text(json.dumps({"command": " ".join(["python3", *sys.argv]), "device": torch.cuda.get_device_name(),
                                 "rows": rows}, indent=1) + "\n")
