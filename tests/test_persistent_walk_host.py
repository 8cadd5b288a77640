"""The persistent forward's walk (work_walk and work_coords of templates/fwd_wgmma/kernel.cu.j2), compiled for the
host from a committed generated file and run over many grids: every query block of every head is taken exactly
once (with either walk, where the kernel chooses whether to pair an odd ramp's middle blocks). The GPU test (test_gpu_verify.py,
persistent_walks) checks the numbers on a few grids; this one checks the walk's arithmetic on thousands, where
no GPU is needed (it skips without a host C++ compiler).
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# A persistent spec with a window (its ramp ends before the last query block) and the causal mask.
GENERATED = ROOT / "generated" / "h100_wgmma_d128_window_persistent.cu"

# What the kernel's functions need from CUDA and from the rest of the file, for a host build.
HOST_PRELUDE = r"""
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>
using std::max;
using std::min;
#define __device__
#define __forceinline__ inline
struct Dim { unsigned x; };
static Dim gridDim;
constexpr int kBlockM = 128, kBlockN = 128;
struct Params { int batch, heads, kv_heads, seqlen_q, seqlen_k, window_lo, window_hi, causal_offset; };
"""

HOST_MAIN = r"""
// Whether the walk pairs middle blocks (0 where the kernel's walk has no such choice).
template <class W> auto pairs_middles(const W& w, int) -> decltype(w.paired_middles, int()) { return w.paired_middles; }
template <class W> int pairs_middles(const W&, long) { return 0; }
// Whether the walk took lone longest blocks (0 where the kernel's walk has no such choice).
template <class W> auto takes_alone(const W& w, int) -> decltype(w.longest_alone, int()) { return w.longest_alone; }
template <class W> int takes_alone(const W&, long) { return 0; }
// Whether the walk deals the query blocks out in the snake (0 where the kernel's walk has no snake).
template <class W> auto takes_snake(const W& w, int) -> decltype(w.snake, int()) { return w.snake; }
template <class W> int takes_snake(const W&, long) { return 0; }
// The whole rounds of units before the snake (0 where the kernel's walk has no snake_tail).
template <class W> auto unit_rounds(const W& w, int) -> decltype(w.unit_rounds, int()) { return w.snake ? w.unit_rounds : 0; }
template <class W> int unit_rounds(const W&, long) { return 0; }

// Every grid: each (head_batch, query block) taken once; prints the grids counted and how many paired.
template <Mask kMask>
static bool covers(const Params& p, int resident, long& paired, long& alone, long& snaked, long& tail1, long& tail2) {
    gridDim.x = resident;
    const int m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM, head_batches = p.heads * p.batch;
    const WorkWalk w = work_walk<kMask>(m_blocks, p);
    paired += pairs_middles(w, 0);
    alone += takes_alone(w, 0);
    snaked += takes_snake(w, 0);
    tail1 += unit_rounds(w, 0) == 1;
    tail2 += unit_rounds(w, 0) >= 2;
    std::vector<int> seen(static_cast<size_t>(head_batches) * m_blocks, 0);
    for (int b = 0; b < resident; ++b)
        for (int pos = b; pos < w.positions; pos += resident) {
            BlockCoords c{};
            if (!work_coords<kMask>(pos, w, p, c)) continue;
            const int hb = c.batch * p.heads + c.head, m = c.m0 / kBlockM;
            if (hb < 0 || hb >= head_batches || m < 0 || m >= m_blocks || c.m0 % kBlockM) return false;
            ++seen[static_cast<size_t>(hb) * m_blocks + m];
        }
    for (int s : seen) if (s != 1) return false;
    return true;
}

int main() {
    long grids = 0, paired = 0, alone = 0, snaked = 0, tail1 = 0, tail2 = 0, failed = 0;
    for (int m_blocks = 1; m_blocks <= 17; ++m_blocks)   // past kMaxSnakeBlocks (16)
        for (int head_batches : {1, 2, 3, 5, 8, 12, 16, 24, 33, 64, 96, 128, 129, 256, 511, 1000})
            for (int resident : {7, 13, 64, 100, 131, 132})
                for (int window_left : {-1, 128, 300, 600, 1000}) {
                    Params p{1, head_batches, 1, m_blocks * kBlockM - (m_blocks > 1 ? 37 : 0), m_blocks * kBlockM,
                             -window_left, 0, 0};
                    if (head_batches % 2 == 0) p = Params{2, head_batches / 2, 1, p.seqlen_q, p.seqlen_k, p.window_lo, 0, 0};
                    const bool ok = window_left < 0 ? covers<Mask::Causal>(p, resident, paired, alone, snaked, tail1, tail2)
                                                    : covers<Mask::Window>(p, resident, paired, alone, snaked, tail1, tail2);
                    ++grids;
                    if (!ok) {
                        ++failed;
                        if (failed <= 10) printf("missed: %d query blocks, %d heads x batch, %d resident, window %d\n",
                                                 m_blocks, head_batches, resident, window_left);
                    }
                }
    printf("grids %ld paired %ld alone %ld snaked %ld tail1 %ld tail2 %ld failed %ld\n", grids, paired, alone, snaked,
           tail1, tail2, failed);
    // The busiest resident block's work at 3x16x768 and 6x16x768 causal on 132 SMs, in query blocks (block m
    // counts m + 1).
    for (int batch : {3, 6}) {
        const Params p{batch, 16, 16, 6 * kBlockM, 6 * kBlockM, 1, 0, 0};
        gridDim.x = 132;
        const WorkWalk w = work_walk<Mask::Causal>(6, p);
        int busiest = 0;
        for (int b = 0; b < 132; ++b) {
            int load = 0;
            for (int pos = b; pos < w.positions; pos += 132) {
                BlockCoords c{};
                if (work_coords<Mask::Causal>(pos, w, p, c)) load += c.m0 / kBlockM + 1;
            }
            busiest = max(busiest, load);
        }
        printf("busiest%d %d\n", batch, busiest);
    }
    return failed != 0;
}
"""


# The snake's bound on its busiest block (snake_work_bound) against the snake dealt out here, slot by slot.
HOST_MAIN_SNAKE_BOUND = r"""
int main() {
    long grids = 0, exact = 0, below = 0, most_above = 0;
    for (int resident : {132, 114, 78})
        for (int m_blocks = 2; m_blocks <= kMaxSnakeBlocks; ++m_blocks)
            for (int head_batches = 1; 2 * head_batches <= resident; ++head_batches) {
                const int items = m_blocks * head_batches;
                if (items <= resident) continue;   // one item a block: the walk returns before any choice
                std::vector<int> load(resident, 0);
                for (int i = 0; i < items; ++i) {   // item i: block m_blocks - 1 - i / head_batches, work i / hb off
                    const int round = i / resident, slot = round % 2 ? resident - 1 - i % resident : i % resident;
                    load[slot] += m_blocks - i / head_batches;
                }
                const int busiest = *std::max_element(load.begin(), load.end());
                const int bound = snake_work_bound(m_blocks, head_batches, resident);
                ++grids;
                exact += bound == busiest;
                below += bound < busiest;
                if (resident == 132) most_above = max(most_above, static_cast<long>(bound - busiest));
            }
    printf("grids %ld exact %ld below %ld most_above %ld\n", grids, exact, below, most_above);
    return below != 0;
}
"""


def walk_source(text: str, main: str = HOST_MAIN) -> str:
    """The mask helpers and the walk's functions of a generated persistent forward, for a host build."""
    mask = text[text.index("enum class Mask"):text.index("struct BlockCoords")]
    walk = text[text.index("template <Mask kMask>\nconstexpr bool kRampWalk"):text.index("// The body of both calls")]
    return HOST_PRELUDE + mask + "struct BlockCoords {\n    int m0, head, batch, kv_head;\n};\n" + walk + main


def host_compiler() -> str | None:
    return shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")


def rendered_walk_source(name: str = "", **schedule) -> str:
    """The window spec of GENERATED with the given schedule keys (middle_pairs, short_first, longest_alone, snake,
    snake_tail), rendered here under the name t_window_<name> (the committed members that set them carry only the
    causal mask)."""
    import yaml
    from attngen.render import render_bundle
    from attngen.spec import load_spec, parse_spec
    spec = load_spec(ROOT / "specs" / "h100_wgmma_d128_window_persistent.yaml")
    data = spec.model_dump(mode="json", exclude_defaults=True, by_alias=True)
    data["schedule"].update(schedule)
    data["masks"] = ["causal", "window"]
    data["name"] = "t_window_" + (name or "_".join(sorted(schedule)))
    plan, sources, _ = render_bundle(parse_spec(yaml.safe_dump(data), f"{data['name']}.yaml"))
    assert all(getattr(plan.fragments, key) == value for key, value in schedule.items())
    return sources[0]


WALKS = {"committed": {}, "middle_pairs": {"middle_pairs": True}, "short_first": {"short_first": True},
         "middle_pairs_short_first": {"middle_pairs": True, "short_first": True},
         "longest_alone": {"longest_alone": True}, "longest_alone_short_first": {"longest_alone": True, "short_first": True},
         "middle_pairs_longest_alone": {"middle_pairs": True, "longest_alone": True},
         "middle_pairs_longest_alone_short_first": {"middle_pairs": True, "longest_alone": True, "short_first": True},
         "snake": {"snake": True},
         "middle_pairs_longest_alone_snake": {"middle_pairs": True, "longest_alone": True, "snake": True},
         "middle_pairs_longest_alone_sf_snake": {"middle_pairs": True, "longest_alone": True, "short_first": True,
                                                 "snake": True},
         "middle_pairs_snake": {"middle_pairs": True, "snake": True},
         "middle_pairs_short_first_snake": {"middle_pairs": True, "short_first": True, "snake": True},
         "snake_tail": {"middle_pairs": True, "longest_alone": True, "snake": True, "snake_tail": True},
         "snake_tail_short_first": {"middle_pairs": True, "longest_alone": True, "snake": True, "snake_tail": True,
                                    "short_first": True}}


@pytest.mark.skipif(host_compiler() is None, reason="no host C++ compiler (g++, c++ or clang++) on PATH")
@pytest.mark.parametrize("walk", list(WALKS))
def test_walk_takes_every_query_block_once(tmp_path, walk):
    text = GENERATED.read_text() if walk == "committed" else rendered_walk_source(walk, **WALKS[walk])
    short_first = "second ? top - j : j" if WALKS[walk].get("longest_alone") else "second ? ramp - 1 - k : k"
    assert (short_first in text) == bool(WALKS[walk].get("short_first"))   # the order the walk takes
    assert ("const int odd = ramp % 2, top = ramp - 1 - odd;" in text) == bool(WALKS[walk].get("longest_alone"))
    source = tmp_path / "walk.cpp"
    source.write_text(walk_source(text))
    binary = tmp_path / "walk"
    build = subprocess.run([host_compiler(), "-std=c++17", "-O1", "-w", "-o", str(binary), str(source)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:]
    counts = dict(zip(run.stdout.split()[::2], (int(w) for w in run.stdout.split()[1::2])))
    assert counts["failed"] == 0 and counts["grids"] == 17 * 16 * 6 * 5
    if WALKS[walk].get("middle_pairs"):
        assert 0 < counts["paired"] < counts["grids"]   # both walks taken (the rule pairs some odd ramps, not all)
    else:
        assert "paired_middles" not in text and counts["paired"] == 0
    if WALKS[walk].get("middle_pairs") and WALKS[walk].get("longest_alone"):
        # The walk chooses per call: lone longest blocks on some odd ramps, paired middles on others.
        assert 0 < counts["alone"] < counts["grids"] - counts["paired"]
    else:
        assert counts["alone"] == 0
    snake, choice = WALKS[walk].get("snake"), WALKS[walk].get("snake") and WALKS[walk].get("middle_pairs")
    if choice:   # the walk chooses per call: the snake on some causal grids, the units on the rest
        assert 0 < counts["snaked"] < counts["grids"] / 5
    elif snake:  # every causal grid with more query blocks than resident blocks
        assert counts["snaked"] > 0
    else:
        assert "w.snake" not in text and counts["snaked"] == 0
    if WALKS[walk].get("snake_tail"):   # whole rounds of units before the snake: one round on some grids, more on others
        assert counts["tail1"] > 0 and counts["tail2"] > 0
    else:
        assert counts["tail1"] == counts["tail2"] == 0
    # 48 heads of six query blocks on 132 SMs: 144 units of seven blocks' work take two rounds (14); dealt out
    # longest first in a snake, the busiest block gets 8 (the mean is 7.6).
    assert counts["busiest3"] == (8 if snake else 14)
    # 96 heads: 288 units take three rounds (21); the snake alone gives 16, but the choice keeps the units
    # there (heads x batch above half the resident blocks: the snake would read K/V from memory again), unless its
    # snake may follow whole rounds of units: one round of 44 heads' units (7), the snake over the other 52 (9).
    tail = WALKS[walk].get("snake_tail")
    assert counts["busiest6"] == (16 if (snake and not choice) or tail else 21)


@pytest.mark.skipif(host_compiler() is None, reason="no host C++ compiler (g++, c++ or clang++) on PATH")
def test_snake_bound_is_never_below_the_busiest_block(tmp_path):
    """The walk takes the snake on an upper bound of its busiest block's work: never below the work the snake
    deals that block (or the walk could take a snake that costs more than its rule allows), exact on about two
    thirds of the grids up to kMaxSnakeBlocks query blocks, at most 2 above on 132 SMs there (the template's comment
    gives at most 4 above over 2-32 blocks)."""
    source = tmp_path / "bound.cpp"
    source.write_text(walk_source(rendered_walk_source("bound", **WALKS["middle_pairs_longest_alone_snake"]),
                                  HOST_MAIN_SNAKE_BOUND))
    binary = tmp_path / "bound"
    build = subprocess.run([host_compiler(), "-std=c++17", "-O1", "-w", "-o", str(binary), str(source)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120)
    counts = dict(zip(run.stdout.split()[::2], (int(w) for w in run.stdout.split()[1::2])))
    assert run.returncode == 0 and counts["below"] == 0, run.stdout
    assert counts["grids"] == 1674 and counts["exact"] == 1105 and counts["most_above"] == 2
