"""A model of the persistent forward's walk (templates/fwd_wgmma/kernel.cu.j2, work_walk and work_coords) at d256
(128-row query blocks, 80-key tiles, 132 resident blocks unless named): it checks that the walk visits every query
block of every head exactly once over many shapes, windows, key offsets (bottom-right windows with seqlen_q !=
seqlen_k shift both bounds) and resident counts (the plain walk and the window units), then prints, for
Gemma's causal windows, the busiest resident block's tiles over the mean (1.0: every block finishes together),
plain walk against window units. No GPU.
Usage: python3 docs/hopper-h200/d256/walk_model.py"""
BM, BN, G = 128, 80, 132

def key_begin(row, lo): return max(row + lo, 0)
def key_end(row, hi, sk): return min(sk, row + 1 + hi)
def cost(m, lo, hi, sk, left=True):
    last = m * BM + BM - 1
    end = (max(key_end(last, hi, sk), 0) + BN - 1) // BN
    first = key_begin(m * BM, lo) // BN if left else 0
    return max(end - first, 0)

def walk(M, HB, lo, hi, sk, mode, causal=False, G=G):
    left = not causal
    c = lambda m: cost(m, lo, hi, sk, left)
    if M * HB <= G: mode = "plain"
    ramp = M
    if mode == "new" and left:
        l, h = 0, M
        while l < h:
            mid = (l + h) // 2
            if key_begin(mid * BM, lo) > 0: h = mid
            else: l = mid + 1
        ramp = l
        if ramp < 2: mode = "plain"
        else:
            widest = max(c(ramp - 1), c(ramp) if ramp < M else 0)
            unit = c(0) + c(ramp - 1)
            if 4 * unit > 5 * widest: mode = "plain"
    per_block = [[] for _ in range(G)]
    if mode == "plain":
        for pos in range(M * HB):
            m = pos % M; hb = pos // M
            if causal: m = M - 1 - m
            per_block[pos % G].append((hb, m))
        return per_block
    pairs = ramp // 2; flats = M - ramp; per_head = pairs + flats
    units = (pairs + ramp % 2 + flats) * HB
    positions = (units + G - 1) // G * 2 * G
    head_units = per_head * HB
    for pos in range(positions):
        in_round = pos % (2 * G); unit = pos // (2 * G) * G + in_round % G; second = in_round // G
        if unit < head_units:
            k = unit % per_head; hb = unit // per_head
            if k >= pairs:
                if second: continue
                m = ramp + k - pairs
            else:
                m = k if second else ramp - 1 - k
        else:
            hb = unit - head_units; m = pairs
            if second or ramp % 2 == 0 or hb >= HB: continue
        per_block[pos % G].append((hb, m))
    return per_block

def check(M, HB, lo, hi, sk, mode, causal=False, G=G):
    pb = walk(M, HB, lo, hi, sk, mode, causal, G)
    got = sorted(x for b in pb for x in b)
    assert got == sorted((hb, m) for hb in range(HB) for m in range(M)), (M, HB, lo, hi, mode)
    loads = [sum(cost(m, lo, hi, sk, not causal) for _, m in b) for b in pb]
    return max(loads), sum(loads) / G

if __name__ == "__main__":
    # coverage over many shapes and windows
    n = 0
    for M in list(range(1, 40)) + [64, 127, 128]:
        for HB in (1, 2, 3, 7, 16, 32):
            for (l, r) in ((1023, 0), (4095, 0), (127, 0), (0, 0), (255, 255), (4095, 10**9), (100, 50), (10**9, 0), (-50, 300)):
                for shift in (0, 300, -200):      # bottom-right alignment: seqlen_k - seqlen_q added to both bounds
                    sk = max(M * BM + shift, 1)
                    for g in ((G, 1, 7, 66) if shift == 0 else (G,)):
                        for mode in ("plain", "new"):
                            check(M, HB, -l + shift, r + shift, sk, mode, G=g); n += 1
    print("coverage ok", n)
    for B, H, S in ((2, 16, 4096), (1, 16, 8192), (1, 16, 16384), (4, 16, 2048), (1, 8, 32768), (2, 32, 8192)):
        for W in (1023, 4095):
            M = S // BM
            r = {mode: check(M, B * H, -W, 0, S, mode) for mode in ("plain", "new")}
            print(f"{B}x{H}x{S} window {W}: makespan/mean plain {r['plain'][0]/r['plain'][1]:.3f}  new {r['new'][0]/r['new'][1]:.3f}  (new/plain makespan {r['new'][0]/r['plain'][0]:.3f})")
