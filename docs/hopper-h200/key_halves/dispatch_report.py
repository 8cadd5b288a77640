"""The cells of an alternating run (../forward_specs_vs_cudnn.py's JSON) that the dispatch table takes, as an
`attngen bench --json` report (`attngen dispatch --from` reads that form): each chosen shape's rows of the chosen
masks, the named specs' medians over the rounds (a name stands for its cells of every dtype; trials of no committed
spec left out); cuDNN's time kept as an "sdpa:cudnn" timing, which the table ignores.
Usage: python3 docs/hopper-h200/key_halves/dispatch_report.py IN.json OUT.json SHAPE[,SHAPE...] SPEC[,SPEC...]
       [none|causal|both]"""
import json
import sys


def main(in_path, out_path, shapes, specs, masks="none"):
    names = {n + suffix for n in specs.split(",") for suffix in ("", "_bf16")} | {"sdpa:cudnn"}
    causal_taken = {"none": (False,), "causal": (True,), "both": (False, True)}[masks]
    run = json.load(open(in_path))
    results = []
    for r in run["rows"]:
        if r["shape"] not in shapes.split(",") or r["causal"] not in causal_taken:
            continue
        b, h, s, d = map(int, r["shape"].split("x"))
        timings = [{"impl": name, "median_us": us, "status": "ok", "note": "", "spread_pct": 0.0}
                   for name, us in r["us"].items() if name in names]
        results.append({"case": {"batch": b, "heads": h, "seqlen": s, "head_dim": d, "dtype": r["dtype"],
                                 "causal": r["causal"], "head_dim_v": 0},
                        "label": f"{r['shape']} {r['dtype']}{' causal' if r['causal'] else ''}", "timings": timings})
    json.dump({"gpu": run["device"], "environment": {"torch": run["torch"], "from": run["command"]},
               "results": results}, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    if len(sys.argv) not in (5, 6):
        sys.exit(__doc__)
    main(*sys.argv[1:])
