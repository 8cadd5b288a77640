"""Which kernels SDPA's cuDNN backend launches for a forward call, with their grid, block, registers and shared
memory (torch.profiler's kernel records), beside attngen.attention's, so that a cell's gap can be read against how
the library tiles it. Usage: python3 docs/hopper-h200/own_in_turns/cudnn_kernels.py OUT.json [BxHxSxD[:causal],...]
"""
import json
import sys
import tempfile

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attngen

SHAPES = "8x16x640x256:causal,16x16x512x256:causal,16x16x1024x256:causal,8x16x640x192:causal,16x16x512x192:causal"
KEYS = ("grid", "block", "registers per thread", "shared memory", "est. achieved occupancy %")


def kernels(call):
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.load(open(f.name))
    return [{"name": e["name"], "us": e.get("dur"), **{k: e.get("args", {}).get(k) for k in KEYS}}
            for e in trace["traceEvents"] if e.get("cat") == "kernel"]


def main(out_path, shapes=SHAPES):
    rows = []
    for item in shapes.split(","):
        shape, _, mask = item.partition(":")
        b, h, s, d = map(int, shape.split("x"))
        causal = mask == "causal"
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        def cudnn():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        for who, call in (("sdpa:cudnn", cudnn), ("attngen.attention", lambda: attngen.attention(q, k, v, causal=causal))):
            for kern in kernels(call):
                rows.append({"shape": shape, "causal": causal, "who": who, **kern})
                print(f"{shape:14} {'causal' if causal else 'none':6} {who:18} {kern['us']!s:>7} us grid {kern['grid']} "
                      f"block {kern['block']} regs {kern['registers per thread']} smem {kern['shared memory']} "
                      f"{kern['name'][:90]}", flush=True)
    json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, open(out_path, "w"),
              indent=1)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(*sys.argv[1:])
