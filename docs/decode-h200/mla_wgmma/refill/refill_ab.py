"""MLA decode, the wgmma cell: where a tile's step issues the ring's next copy. "wgmma": the cell as it was,
refill: before_scores (h200_decode_d576_mla_wgmma_before_bf16 beside this script); "rds": the cell now,
refill: during_scores (specs/h200_decode_d576_mla_wgmma_bf16); bf16; the timing, bytes and FLOPs as
../mla_ab.py gives them.

Usage: python3 docs/decode-h200/mla_wgmma/refill/refill_ab.py OUT.json [ROUNDS] [PAGE]"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import mla_ab  # noqa: E402
import attngen  # noqa: E402

out_path, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5
page = int(sys.argv[3]) if len(sys.argv) > 3 else 0
cells = {"wgmma": attngen.load(HERE / "h200_decode_d576_mla_wgmma_before_bf16.yaml"),
         "rds": attngen.load(mla_ab.ROOT / "specs" / "h200_decode_d576_mla_wgmma_bf16.yaml")}
shapes = ((8, 128, 4096, 1), (8, 128, 8192, 1), (32, 128, 4096, 1), (64, 128, 2048, 1), (1, 128, 32768, 1),
          (8, 128, 4096, 2), (32, 64, 4096, 1), (32, 32, 4096, 1))
rows = mla_ab.cell_rows(cells, shapes, rounds, page, ("wgmma/rds", lambda us: us["wgmma"] / us["rds"]))
mla_ab.write(out_path, f"python3 docs/decode-h200/mla_wgmma/refill/refill_ab.py OUT.json {rounds}" + (f" {page}" if page else ""),
             rows)
