"""B8 32/32 d96 at 16384 keys, contiguous: the fp16 cache's decode call in CUDA graphs (fp8_kv_decode.py's loop) alone,
beside an e4m3 graph, alternating with it, with a new query tensor and after the e4m3 caches are freed, and eager;
to tell whether the fp16 time depends on the script around it. Usage: python3 docs/decode-h200/d96_copy/e4m3_rows/fp16_contiguous_probe.py"""
import statistics, sys, time
import torch
sys.path.insert(0, 'docs/measurements')
import fp8_kv_decode as fk
from attngen.eval import table_ab
specs = table_ab.record_specs()
B, H, Hkv, D, S = 8, 32, 32, 96, 16384
scales = (torch.tensor([0.02], device="cuda"), torch.tensor([0.01], device="cuda"))
q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.float16)
lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
s16 = fk.caches(B, Hkv, S, D, False, False, 2)
g16 = fk.graph_of(q, s16, lens, scales, 30)
print("fp16 alone", [round(fk.time_graph(g16, 30), 1) for _ in range(3)], specs, flush=True)
s8 = fk.caches(B, Hkv, S, D, True, False, 2)
g8 = fk.graph_of(q, s8, lens, scales, 30)
print("e4m3 built; fp16", [round(fk.time_graph(g16, 30), 1) for _ in range(3)], "e4m3", [round(fk.time_graph(g8, 30), 1) for _ in range(3)], specs, flush=True)
print("alternating", [(round(fk.time_graph(g16, 30), 1), round(fk.time_graph(g8, 30), 1)) for _ in range(3)], flush=True)
q2 = torch.randn(B, H, 1, D, device="cuda", dtype=torch.float16)
g16b = fk.graph_of(q2, s16, lens, scales, 30)
print("fp16 new q graph", [round(fk.time_graph(g16b, 30), 1) for _ in range(3)], flush=True)
del g8, s8; torch.cuda.empty_cache()
print("fp16 after e4m3 freed", [round(fk.time_graph(g16, 30), 1) for _ in range(3)], flush=True)
from attngen.eval.bench.timing import time_eager
st = fk.step_of(q, s16, lens, scales)
print("fp16 eager", round(time_eager(torch, st, [(0,), (1,)], reps=30, rounds=3), 1), flush=True)
