"""Group rows 17-31 (served by the wgmma cell) against the 16-row and 32-row mma.sync cells, bf16, the loop of
mla_ab.py beside this script. Usage: python3 docs/decode-h200/mla_wgmma/rows_17_31.py OUT.json [ROUNDS]"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mla_ab  # noqa: E402
import attngen  # noqa: E402
cells = {"rows16": attngen.load(mla_ab.ROOT / "specs" / "h200_decode_d576_mla_bf16.yaml"),
         "rows32": attngen.load(mla_ab.ROOT / "specs" / "h200_decode_d576_mla_m32_bf16.yaml"),
         "wgmma": attngen.load(mla_ab.ROOT / "specs" / "h200_decode_d576_mla_wgmma_bf16.yaml")}
shapes = ((32, 20, 4096, 1), (32, 24, 4096, 1), (8, 24, 8192, 1), (64, 24, 4096, 1), (32, 28, 4096, 1),
          (8, 16, 4096, 2), (32, 8, 4096, 3))
rows = mla_ab.cell_rows(cells, shapes, int(sys.argv[2]) if len(sys.argv) > 2 else 3, 0,
                        ("rows16/wgmma", lambda us: us["rows16"] / us["wgmma"]))
mla_ab.write(sys.argv[1], "python3 docs/decode-h200/mla_wgmma/rows_17_31.py OUT.json 3", rows)
