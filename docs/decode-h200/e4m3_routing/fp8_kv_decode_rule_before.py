"""docs/measurements/fp8_kv_decode.py under the combine-kernel cells' co-resident rule from before (32, 64) came
back to it (launch_rules.COMBINE_KERNEL_CO_RESIDENT: ((16, 128), (8, 256))): the "before" side of
entry_before*.json, run with the dispatch table of the commit before (no kv_e4m3_contiguous_s2 entries).
Usage (GPU machine, repository root): python3 docs/decode-h200/e4m3_routing/fp8_kv_decode_rule_before.py --json OUT.json"""
import runpy
import sys

import attngen.core.launch_rules as lr

lr.COMBINE_KERNEL_CO_RESIDENT = ((16, 128), (8, 256))
sys.argv = ["fp8_kv_decode.py"] + sys.argv[1:]
runpy.run_path("docs/measurements/fp8_kv_decode.py", run_name="__main__")
