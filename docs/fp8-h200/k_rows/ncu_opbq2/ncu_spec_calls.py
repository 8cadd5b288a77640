"""Three e4m3 forward calls of one spec at one shape, for ncu: python3 ncu_spec_calls.py SPEC BxHxSxD [causal]."""
import sys, torch, attngen
from attngen.runtime.calls.forward_fp8 import quantize_fp8
spec, shape = sys.argv[1], sys.argv[2]
causal = len(sys.argv) > 3 and sys.argv[3] == "causal"
b, h, s, d = map(int, shape.split("x"))
torch.manual_seed(0)
q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(3))
q8, k8, vt8, qd, kd, vd = quantize_fp8(q, k, v)
kern = attngen.load(spec)
for _ in range(3):
    o = kern(q8, k8, vt8, q_descale=qd, k_descale=kd, v_descale=vd, causal=causal)
torch.cuda.synchronize()
print("ok", spec, shape, float(o.float().abs().mean()))
