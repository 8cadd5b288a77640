"""Host time of merge calls (attngen.merge_attention: a cascade's or a ring's partial results merged): the table's
merge kernel on its full path every call (its prepared calls dropped before each: how every merge ran before it
had a prepared path) and on its prepared path, attngen.merge_attention, and the same merge written in torch ops
(torch.logaddexp and two weighted sums). CPU, wall and GPU us per call with docs/measurements/host_time.py's
timers (rows round-robin, medians of 7 rounds).

Usage: python3 docs/integrations-h200/merge_host.py OUT.json"""
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "measurements"))
import host_time  # noqa: E402
import attngen  # noqa: E402
from attngen.ops import library  # noqa: E402

g = torch.Generator(device="cuda").manual_seed(0)
results = []
for b, s, h, d in ((1, 512, 8, 128), (2, 4096, 32, 128), (8, 1, 32, 128)):
    outs = [torch.randn((b, s, h, d), generator=g, device="cuda").bfloat16() for _ in range(2)]
    lses = [torch.randn((b, h, s), generator=g, device="cuda") for _ in range(2)]
    kernel = library._merge_kernel(outs[0], None)
    label = f"2 parts {b}x{s}x{h}x{d} bf16 bshd"

    def full_path():
        kernel._prepared.clear()
        return kernel(outs, lses, layout="bshd")

    def in_torch():
        lse = torch.logaddexp(lses[0], lses[1])
        w = [torch.exp(x - lse).transpose(1, 2).unsqueeze(-1) for x in lses]
        return (outs[0] * w[0] + outs[1] * w[1]).to(outs[0].dtype), lse

    results.append(host_time.row(f"{label}: merge kernel, full path every call", full_path))
    results.append(host_time.row(f"{label}: merge kernel, prepared", lambda: kernel(outs, lses, layout="bshd")))
    results.append(host_time.row(f"{label}: attngen.merge_attention", lambda: attngen.merge_attention(
        outs[0], lses[0], outs[1], lses[1], layout="bshd")))
    results.append(host_time.row(f"{label}: torch ops", in_torch))
    host_time.measure_rows()
json.dump({"command": "python3 docs/integrations-h200/merge_host.py OUT.json", "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "rows": results}, open(sys.argv[1], "w"), indent=1)
