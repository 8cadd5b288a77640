"""The small GPT step (`attngen bench --gpt-step`'s model and step) with attngen.attention and with SDPA: CPU time
per operator under torch.profiler, per step over 10 steps, and the attention operators' lines marked [attn].

Usage (GPU machine, repository root): python3 docs/backward-h200/gpt_step_rounds400/gpt_step_profile.py compiled|eager
(TORCH_LOGS=output_code beside it prints the compiled graphs' code to stderr)."""
import sys, time, statistics
import torch
from torch.profiler import profile, ProfilerActivity
from attngen.eval.bench import gpt_model
from attngen.eval.bench.gpt_step import VOCAB, DEFAULT_GPT as S
torch.manual_seed(0)
init = {k: v.clone() for k, v in gpt_model.GPT(VOCAB, S.d_model, S.heads, S.layers, S.seqlen, False).state_dict().items()}
g = torch.Generator(device="cuda").manual_seed(0)
data = [torch.randint(0, VOCAB, (S.batch, S.seqlen + 1), generator=g, device="cuda") for _ in range(10)]
mode = sys.argv[1] if len(sys.argv) > 1 else "compiled"
steps = {}
for use in (False, True):
    m = gpt_model.GPT(VOCAB, S.d_model, S.heads, S.layers, S.seqlen, use).cuda(); m.load_state_dict(init)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01)
    steps[use] = gpt_model.training_step(torch.compile(m) if mode == "compiled" else m, opt, torch.bfloat16, VOCAB)
    for x in data[:4]: steps[use](x)
    torch.cuda.synchronize()
for use in (False, True):
    st = steps[use]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for x in data: st(x)
        torch.cuda.synchronize()
    name = "attngen" if use else "sdpa"
    print(f"== {mode} {name}: top ops by self CPU, per step (10 steps)")
    ka = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    tot = sum(e.self_cpu_time_total for e in ka)
    print(f"total self CPU per step {tot/10:.0f} us")
    for e in ka[:30]:
        print(f"{e.key[:70]:<70} calls/step {e.count/10:6.1f} self {e.self_cpu_time_total/10:8.1f} us  total {e.cpu_time_total/10:8.1f}")
    for e in ka:
        if "attngen" in e.key or "attention" in e.key or "cudnn" in e.key.lower():
            print(f"  [attn] {e.key[:80]:<80} calls/step {e.count/10:5.1f} self {e.self_cpu_time_total/10:7.1f} total {e.cpu_time_total/10:7.1f}")
