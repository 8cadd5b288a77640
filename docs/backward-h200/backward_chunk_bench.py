"""specs/lab/h100_bwd_d64.yaml with query chunks of 32 and 64 (written to a temporary folder), beside
SDPA's flash (FA2) backward, in one process.

Usage: python3 docs/backward-h200/backward_chunk_bench.py OUT.json

fp16 d64, GPU time of one backward call (CUDA events around each call, median of 15 after 3
warm-up calls, the best of two interleaved rounds); the largest |difference| of each variant's
gradients from the committed spec's is recorded too.
"""
import json, re, sys, tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attngen
from attngen.core.spec_cells import cell_at
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))   # the helpers the scripts share
from gpu_timing import med

ROOT = Path(__file__).resolve().parents[2]


def variants(folder: Path) -> dict:
    text = cell_at(ROOT / "specs" / "lab" / "h100_bwd_d64.yaml").text     # its fp16 cell, as a file of its own
    out = {}
    for chunk in (32, 64):
        name = f"bwd_d64_chunk{chunk}"
        body = re.sub(r"(?m)^query_chunk: .*\n", "", text).replace("name: h100_bwd_d64", f"name: {name}")
        body = body.replace("masks: [none, causal]\n", f"masks: [none, causal]\nquery_chunk: {chunk}\n")
        path = folder / f"{name}.yaml"
        path.write_text(body)
        out[name] = attngen.load(path)
    return out


def main(out):
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ks = {"h100_bwd_d64": attngen.load(ROOT / "specs" / "lab" / "h100_bwd_d64.yaml"), **variants(Path(tmp))}
        for b, h, s in ((16, 16, 512), (4, 16, 2048), (1, 16, 8192)):
            for causal in (False, True):
                g = torch.Generator(device="cuda").manual_seed(0)
                q, k, v, do = (torch.randn(b, h, s, 64, device="cuda", dtype=torch.float16, generator=g)
                               for _ in range(4))
                o, lse = attngen.attention(q, k, v, causal=causal, return_lse=True)
                row = {"shape": f"{b}x{h}x{s}x64", "causal": causal}
                ref = ks["h100_bwd_d64"](q, k, v, o, lse, do, causal=causal)
                for name, kern in ks.items():
                    got = kern(q, k, v, o, lse, do, causal=causal)
                    row[f"{name}_maxdiff"] = max((x.float() - y.float()).abs().max().item() for x, y in zip(got, ref))
                for _ in range(2):
                    for name, kern in ks.items():
                        row[name] = min(row.get(name, float("inf")), med(lambda: kern(q, k, v, o, lse, do, causal=causal)))
                qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
                with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                    fo = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
                row["flash"] = med(lambda: torch.autograd.grad(fo, (qq, kk, vv), do, retain_graph=True))
                print(json.dumps(row), flush=True)
                rows.append(row)
    json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, open(out, "w"),
              indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
