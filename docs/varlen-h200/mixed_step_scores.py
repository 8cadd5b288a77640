"""A serving step with score modifiers (gpt-oss's learned sinks; softcap with ALiBi): the step of
docs/measurements/serving_step.py (64 sequences in a paged pool, prefill chunks beside single decode
tokens, one attngen.attention_varlen call) with sinks= or softcap=/alibi_slopes=, timed GPU, eager and
CUDA graph (attngen alone: SDPA takes none of them). Run it in two trees to compare how the decode rows
are served (the varlen kernel, or the paged decode kernel with the same modifiers).

Usage (GPU machine, repository root): python3 docs/varlen-h200/mixed_step_scores.py OUT.json"""
import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measurements"))
import attngen  # noqa: E402
from serving_step import step_inputs, timings  # noqa: E402

CASES = [  # heads, head_dim, dtype, modifiers
    ("64/8", 64, "bf16", ("sinks",)),          # gpt-oss 20B's causal layers
    ("32/8", 128, "bf16", ("sinks",)),
    ("32/8", 128, "fp16", ("softcap", "alibi")),
]


def main() -> int:
    rows = []
    for heads, d, dt, mods in CASES:
        args = argparse.Namespace(context="512:8192", chunk=512, prefill=8, heads=heads, head_dim=d, page_size=16)
        gen = torch.Generator(device="cuda").manual_seed(0)
        t = step_inputs(args, torch.float16 if dt == "fp16" else torch.bfloat16, gen)
        hq = t["hq"]
        kw = {}
        if "sinks" in mods:
            kw["sinks"] = torch.randn(hq, generator=gen, device="cuda")
        if "softcap" in mods:
            kw["softcap"] = 30.0
        if "alibi" in mods:
            kw["alibi_slopes"] = torch.rand(hq, generator=gen, device="cuda") * 0.3
        max_q, max_k = max(t["new"]), max(t["contexts"])

        def step():
            return attngen.attention_varlen(t["q"], t["kp"], t["vp"], t["cu_q"], None, max_q, max_k, causal=True,
                                            block_table=t["table"], seqused_k=t["used"], **kw)
        step()
        attngen.check_errors()
        row = {"heads": heads, "head_dim": d, "dtype": dt, "modifiers": list(mods), "sequences": 64, "prefill": 8,
               "chunk": 512, "page_size": 16, **timings(step, 30)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    with open(sys.argv[1], "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
