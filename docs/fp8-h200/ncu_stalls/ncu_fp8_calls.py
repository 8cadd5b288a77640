"""Three e4m3 forward calls through attngen.attention_fp8 at 2x16x8192x128 (the table's pick), for ncu."""
import sys, torch, attngen
from attngen.runtime.calls.forward_fp8 import quantize_fp8
causal = len(sys.argv) > 1 and sys.argv[1] == "causal"
torch.manual_seed(0)
q, k, v = (torch.randn(2, 16, 8192, 128, device="cuda", dtype=torch.float16) for _ in range(3))
q8, k8, vt8, qd, kd, vd = quantize_fp8(q, k, v)
for _ in range(3):
    o = attngen.attention_fp8(q8, k8, vt8, q_descale=qd, k_descale=kd, v_descale=vd, causal=causal)
torch.cuda.synchronize()
print("ok", o.shape, o.dtype, float(o.float().abs().mean()))
