"""MLA decode: the 16-row cell (h200_decode_d576_mla_bf16, one block of 4 warps per SM) against the cell of
32-row blocks (h200_decode_d576_mla_m32_bf16: two 16-row groups of 4 warps sharing each cache tile), each at
its own split count, alternating in one process; the timing and bytes as mla_wgmma/mla_ab.py gives them.
(tests/test_gpu_mla_decode.py checks the two cells' bits.)

PAGE > 0: paged caches (pages of PAGE, each sequence's pages shuffled in a pool; bytes still B x keys x 576 x 2).

Usage: python3 docs/decode-h200/mla_rows_ab.py OUT.json [ROUNDS] [PAGE]"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "mla_wgmma"))
import mla_ab  # noqa: E402
import attngen  # noqa: E402

out_path, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5
page = int(sys.argv[3]) if len(sys.argv) > 3 else 0
cells = {"rows16": attngen.load(mla_ab.ROOT / "specs" / "h200_decode_d576_mla_bf16.yaml"),
         "rows32": attngen.load(mla_ab.ROOT / "specs" / "h200_decode_d576_mla_m32_bf16.yaml")}
shapes = ((8, 128, 4096, 1), (8, 128, 8192, 1), (32, 128, 4096, 1), (64, 128, 2048, 1), (1, 128, 32768, 1),
          (8, 128, 4096, 2), (8, 64, 8192, 1), (32, 64, 4096, 1), (8, 32, 8192, 1), (32, 32, 4096, 1),
          (32, 16, 4096, 2), (32, 16, 8192, 1), (128, 16, 4096, 1))
rows = mla_ab.cell_rows(cells, shapes, rounds, page, ("rows16/rows32", lambda us: us["rows16"] / us["rows32"]))
mla_ab.write(out_path, f"python3 docs/decode-h200/mla_rows_ab.py OUT.json {rounds}" + (f" {page}" if page else ""), rows)
