"""The models' variant calls that forced_trial.py and entry_models.py time (H200 measurements of the variant cells
on the persistent walk), and the input sets they rotate through."""
import math

import torch

# (label, head dim, member, heads, kv heads, call keywords, shapes (batch, seqlen)); member "base/persistent" where
# the two cells' members differ

CALLS = (
    ("Mistral: causal window 4095", 128, "window", 32, 8, {"window": (4095, 0)}, ((8, 512), (4, 1024), (4, 2048), (2, 4096), (1, 8192), (1, 16384))),
    ("Gemma 3 27B local: causal window 1023", 128, "window", 32, 16, {"window": (1023, 0)}, ((4, 2048), (2, 4096), (1, 8192), (1, 16384))),
    ("Gemma 2 27B global: softcap 50, causal", 128, "softcap", 32, 16, {"softcap": 50.0}, ((8, 512), (4, 1024), (2, 4096), (1, 8192), (1, 16384))),
    ("Gemma 2 27B local: softcap 50, causal window 4095", 128, "window_softcap/softcap", 32, 16, {"softcap": 50.0, "window": (4095, 0)}, ((2, 4096), (1, 8192), (1, 16384))),
    ("softcap 50, full", 128, "softcap", 32, 16, {"softcap": 50.0, "causal": False}, ((4, 1024), (2, 4096))),
    ("sinks, causal", 128, "sink", 32, 8, {"sinks": True}, ((8, 512), (4, 1024), (2, 4096), (1, 8192), (1, 16384))),
    ("sinks, causal window 4095", 128, "sink", 32, 8, {"sinks": True, "window": (4095, 0)}, ((2, 4096), (1, 16384))),
    ("gpt-oss: sinks, causal", 64, "sink", 64, 8, {"sinks": True}, ((8, 512), (4, 1024), (2, 2048), (1, 4096), (1, 8192), (1, 16384))),
    ("gpt-oss: sinks, causal window 127", 64, "sink", 64, 8, {"sinks": True, "window": (127, 0)}, ((8, 512), (4, 1024), (1, 4096), (1, 16384))),
    ("sinks, causal window 4095", 64, "sink", 64, 8, {"sinks": True, "window": (4095, 0)}, ((1, 8192), (1, 16384))),
    ("sinks, full", 64, "sink", 64, 8, {"sinks": True, "causal": False}, ((8, 512), (4, 1024), (2, 2048), (1, 4096))),
    ("causal window 1023", 64, "window", 16, 16, {"window": (1023, 0)}, ((8, 512), (4, 2048), (1, 8192), (1, 16384))),
)


def sets_for(b, h, hk, s, d, gen, dtype=torch.bfloat16, dv=None):
    dv = dv or d                                    # V's head dim (MLA's prefill: 192 for Q and K, 128 for V)
    one = (b * h * (d + dv) + b * hk * (d + dv)) * s * 2
    n = max(2, min(16, math.ceil(3 * torch.cuda.get_device_properties(0).L2_cache_size / one)))
    return [tuple(torch.randn(shape, generator=gen, device="cuda").to(dtype)
                  for shape in ((b, h, s, d), (b, hk, s, d), (b, hk, s, dv))) for _ in range(n)]
