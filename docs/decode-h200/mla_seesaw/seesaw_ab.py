"""MLA decode: the seesaw cell (h200_decode_d576_mla_seesaw_bf16) against the wgmma cell of shared tiles
(h200_decode_d576_mla_wgmma_bf16), bf16, alternating in one process (docs/decode-h200/mla_wgmma/mla_ab.py's loop).
Usage: python3 docs/decode-h200/mla_seesaw/seesaw_ab.py OUT.json [ROUNDS] [PAGE]"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "mla_wgmma"))
import mla_ab  # noqa: E402
import attngen  # noqa: E402
out_path, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
page = int(sys.argv[3]) if len(sys.argv) > 3 else 0
cells = {"wgmma": attngen.load(mla_ab.ROOT / "specs" / "h200_decode_d576_mla_wgmma_bf16.yaml"),
         "seesaw": attngen.load(mla_ab.ROOT / "specs" / "h200_decode_d576_mla_seesaw_bf16.yaml")}
shapes = ((32, 128, 4096, 1), (8, 128, 8192, 1), (64, 128, 2048, 1), (1, 128, 32768, 1), (2, 128, 16384, 1), (4, 128, 8192, 1),
          (8, 128, 4096, 2), (32, 64, 4096, 1), (8, 32, 8192, 1), (32, 24, 4096, 1), (128, 128, 1024, 1), (16, 128, 16384, 1))
rows = mla_ab.cell_rows(cells, shapes, rounds, page, ("wgmma/seesaw", lambda us: us["wgmma"] / us["seesaw"]))
mla_ab.write(out_path, "python3 docs/decode-h200/mla_seesaw/seesaw_ab.py OUT.json %d%s" % (rounds, f" {page}" if page else ""), rows)
