"""Do decode's splits stream faster when each reads every num_splits-th tile? (#60: the cells of 1 GB and more are
0.987-0.999x the faster SDPA backend back to back, and the 67-134 MB cells below 90 % of the copy.)

The probe of a call's fixed cost (docs/decode-h200/stream_floor/) fitted a plain read at 4.71 TB/s over the whole
buffer grid-strided and at 4.47 TB/s in 128 contiguous slices (a split call's shape); attngen's decode fitted 4.50,
cuDNN 4.73. With `split_tiles: interleaved` split s reads tiles s, s + num_splits, ..., so the grid's blocks read
neighbouring tiles at any one time.

Per cell (bf16, d128, one new token, contiguous caches): the kernel the dispatch table picks for
attngen.attention_with_kvcache ("slices"), the same cell with split_tiles: interleaved (rendered and compiled here,
launched the same way, the same split count), and SDPA's cuDNN backend; per call and back to back (30 calls between
two events), alternating over ROUNDS rounds, caches rotated past L2. The largest difference from the built kernel's
output is reported (the splits merge in another order, so not bit for bit). Bare reads in the two orders, without
attention, are ../read_order/read_order.py's.

Usage: python3 docs/decode-h200/split_interleaved/interleaved_ab.py OUT.json [ROUNDS]"""
from pathlib import Path
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attngen.ops import library
from attngen.render import render_bundle
from attngen.spec import load_spec
from attngen.runtime.calls import kernel_class
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "measurements"))
from gpu_timing import alternating_both, write_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
D = 128
CELLS = ((1, 32, 8, 2048), (8, 32, 8, 2048), (2, 32, 8, 8192), (1, 32, 8, 32768), (4, 32, 8, 8192),
         (8, 32, 8, 8192), (1, 32, 8, 131072), (8, 32, 8, 32768), (1, 32, 32, 131072), (64, 64, 8, 8192),
         (32, 32, 8, 32768))


def interleaved_twin(built):
    """The built cell with split_tiles: interleaved, rendered and compiled here."""
    name = built.plan.spec.name
    spec = load_spec(ROOT / "specs" / f"{name}.yaml").model_copy(update={"split_tiles": "interleaved",
                                                                       "name": ("il_" + name)[:48]})
    plan, sources, label = render_bundle(spec)
    assert plan.interleaved_splits and "interleaved_count" in sources[0]
    return kernel_class(plan).from_sources(plan, sources, label=spec.name)


def main(out_path, rounds="5"):
    rounds = int(rounds)
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for b, h, hkv, sk in CELLS:
        kv_bytes = 2 * b * hkv * sk * D * 2
        rot = max(2, min(8, int(3 * 60e6 // kv_bytes) + 1))
        qs = [torch.randn(b, h, 1, D, generator=g, device="cuda").bfloat16() for _ in range(rot)]
        ks = [torch.randn(b, hkv, sk, D, generator=g, device="cuda").bfloat16() for _ in range(rot)]
        vs = [torch.randn(b, hkv, sk, D, generator=g, device="cuda").bfloat16() for _ in range(rot)]
        built = library._decode_kernel(qs[0], ks[0], None, "none", "bhsd")
        kernels = {"slices": built, "interleaved": interleaved_twin(built)}
        calls = {name: (lambda kern: lambda i: kern(qs[i], ks[i], vs[i]))(kern) for name, kern in kernels.items()}

        def cudnn(i):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(qs[i], ks[i], vs[i], enable_gqa=h != hkv)
        calls["cudnn"] = cudnn
        first = calls["slices"](0).float()
        twin = calls["interleaved"](0).float()
        splits = (built.last_splits, kernels["interleaved"].last_splits)
        diff = float((twin - first).abs().max())
        cudnn_diff = float((cudnn(0).float() - first).abs().max())
        med, each = alternating_both(calls, [(i,) for i in range(rot)], rounds)
        row = {"cell": f"B{b} {h}/{hkv} Sk{sk}", "kv_mb": round(kv_bytes / 1e6, 1), "spec": built.plan.spec.name,
               "splits": splits, "max_diff_vs_slices": diff, "cudnn_max_diff_vs_slices": cudnn_diff,
               "median": med, "rounds": each,
               "tb_per_s_b2b": {n: round(kv_bytes / (m["b2b_us"] * 1e-6) / 1e12, 3) for n, m in med.items()}}
        rows.append(row)
        print(f"{row['cell']:<22} {row['kv_mb']:>8.1f} MB {row['spec']:<30} splits {splits}", *(
            f"{n} {m['us']:.2f}/{m['b2b_us']:.2f}" for n, m in med.items()), f"diff {diff:.2e} (cudnn {cudnn_diff:.2e})",
            flush=True)
        qs = ks = vs = calls = kernels = None
        torch.cuda.empty_cache()
    write_report(out_path, rows, f"python3 docs/decode-h200/split_interleaved/interleaved_ab.py OUT.json {rounds}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(*sys.argv[1:])
