"""Full-mask backward: the staggered walk (each key block starting at its own query block), against main's
kernels, with one float per dQ add and with pairs; GPU us (queued, alternating over 3 rounds) and the largest
gradient difference from main's."""
import json, sys
from pathlib import Path
import torch
import attngen
sys.path.insert(0, "docs/measurements")
from gpu_timing import alternating, gradient_difference, old_kernel

rows = []
for name, versions in (("h100_bwd_d128_wgmma_bf16", ("main", "now", "pairs")), ("h100_bwd_d64_wgmma_bf16", ("main", "now"))):
    new = attngen.load(f"specs/{name}.yaml")
    kernels = {v: new if v == "now" else old_kernel(new, Path("out/s13x") / v) for v in versions}
    d = new.plan.head_dim
    for (b, h, s), causal in (((1, 16, 8192), False), ((4, 16, 2048), False), ((1, 16, 8192), True), ((8, 16, 1024), False)):
        torch.manual_seed(0)
        q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        o, lse = attngen.attention(q, k, v, return_lse=True, causal=causal)
        ref = kernels["main"](q, k, v, o, lse, do, causal=causal)
        row = {"spec": name, "shape": f"{b}x{h}x{s}x{d}", "causal": causal}
        for ver, kern in kernels.items():
            row[f"diff_{ver}"] = gradient_difference(kern(q, k, v, o, lse, do, causal=causal), ref)["max_diff"]
        us, row["rounds"] = alternating({ver: (lambda kern=kern: kern(q, k, v, o, lse, do, causal=causal))
                                         for ver, kern in kernels.items()})
        row.update({f"{ver}_us": round(t, 1) for ver, t in us.items()})
        print(json.dumps({k: v for k, v in row.items() if k != "rounds"}), flush=True)
        rows.append(row)
Path(sys.argv[1]).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
