"""MLA decode: the wgmma cell (h200_decode_d576_mla_wgmma_bf16: blocks of 64 group rows over two warpgroups)
against the mma.sync cells of 16-row blocks (h200_decode_d576_mla_bf16) and of 32-row blocks
(h200_decode_d576_mla_m32_bf16), bf16; the timing, bytes and FLOPs as mla_ab.py beside this script gives them.

Usage: python3 docs/decode-h200/mla_wgmma/mla_wgmma_ab.py OUT.json [ROUNDS] [PAGE]"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import mla_ab  # noqa: E402
import attngen  # noqa: E402

out_path, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5
page = int(sys.argv[3]) if len(sys.argv) > 3 else 0
cells = {"rows16": attngen.load(mla_ab.ROOT / "specs" / "h200_decode_d576_mla_bf16.yaml"),
         "rows32": attngen.load(mla_ab.ROOT / "specs" / "h200_decode_d576_mla_m32_bf16.yaml"),
         "wgmma": attngen.load(mla_ab.ROOT / "specs" / "h200_decode_d576_mla_wgmma_bf16.yaml")}
shapes = ((8, 128, 4096, 1), (8, 128, 8192, 1), (32, 128, 4096, 1), (64, 128, 2048, 1), (1, 128, 32768, 1),
          (8, 128, 4096, 2), (8, 64, 8192, 1), (32, 64, 4096, 1), (8, 32, 8192, 1), (32, 32, 4096, 1),
          (32, 16, 4096, 2), (32, 16, 8192, 1), (128, 16, 4096, 1))
rows = mla_ab.cell_rows(cells, shapes, rounds, page,
                        ("best_mma_sync/wgmma", lambda us: min(us["rows16"], us["rows32"]) / us["wgmma"]))
mla_ab.write(out_path, f"python3 docs/decode-h200/mla_wgmma/mla_wgmma_ab.py OUT.json {rounds}" + (f" {page}" if page else ""),
             rows)
