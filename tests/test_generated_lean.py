"""Every generated file carries only what its spec uses: each constant, helper function, type and
Params field a file defines is named again somewhere in that file (nvcc would warn #177-D for an
unused constant; nothing warns for an unused helper or field). Comments and string literals do not
count as uses."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from spec_sample import SAMPLE_FILES, sampled

ROOT = Path(__file__).resolve().parent.parent
GENERATED = sorted((ROOT / "generated").glob("*.cu"))

IDENT = r"[A-Za-z_]\w*"
# Definitions at the start of a line; the name is the last identifier before the first "(", "=",
# "{" or ";" that follows the keyword (template arguments left out).
KEYWORDS = {"constant": r"^(?:template\s*<[^>\n]*>\s*)?constexpr\b", "function": r"__device__\b"}
DEFINITIONS = {
    "type": re.compile(rf"^\s*(?:struct|enum class|enum|union)\s+({IDENT})\s*\{{", re.M),
    "alias": re.compile(rf"^\s*using\s+({IDENT})\s*=", re.M),
}


def declared(code: str, what: str) -> list[str]:
    """Names of the constants (what="constant") or device functions ("function") `code` defines."""
    names = []
    for m in re.finditer(KEYWORDS[what], code, re.M):
        rest = code[m.end():]
        stop = re.search(r"[(;={]", rest)
        if stop is None or (stop.group() == "(") != (what == "function"):
            continue
        head = re.sub(r"<[^<>]*>", "", rest[:stop.start()])
        found = re.findall(IDENT, head)
        if found:
            names.append(found[-1])
    return names


def code_of(source: str) -> str:
    """The source without comments and string literals."""
    source = re.sub(r"/\*.*?\*/", " ", source, flags=re.S)
    source = re.sub(r"//[^\n]*", " ", source)
    return re.sub(r'"(?:\\.|[^"\\\n])*"', '""', source)


def params_fields(code: str) -> list[str]:
    """The named members of the file's Params struct (reserved byte arrays left out)."""
    struct = re.search(r"struct\s+Params\s*\{(.*?)\};", code, re.S)
    if not struct:
        return []
    names = re.findall(rf"({IDENT})\s*(?:\[\d+\])?\s*;", struct.group(1))
    return [n for n in names if not n.startswith("reserved_")]


def unused(source: str) -> list[str]:
    """'what name' for each definition of `source` that nothing else in it names."""
    code = code_of(source)
    out = []
    found = {what: declared(code, what) for what in KEYWORDS}
    found |= {what: pattern.findall(code) for what, pattern in DEFINITIONS.items()}
    for what, names in found.items():
        for name in sorted(set(names)):
            if len(re.findall(rf"\b{name}\b", code)) < 2:
                out.append(f"{what} {name}")
    # a field is used when the code reads it as a member (p.name, s.name, p->name); offsetof in the
    # struct's own static_asserts does not count
    for name in params_fields(code):
        if not re.search(rf"(?:\.|->)\s*{name}\b", code):
            out.append(f"Params field {name}")
    return out


@pytest.mark.parametrize("path", sampled(GENERATED, lambda p: p.name in SAMPLE_FILES, [p.name for p in GENERATED]))
def test_every_definition_in_a_generated_file_is_used(path):
    found = unused(path.read_text())
    assert not found, f"{path.name} defines what it never uses: {', '.join(found)}"


def test_the_check_finds_what_it_looks_for():
    """The test cannot pass by finding nothing: an unused constant, helper, type, alias and field
    are each reported, and used ones are not."""
    source = """
struct Params {
    int used_field;  // +0
    int spare_field;  // +4: named in a comment: spare_field
    unsigned char reserved_8[8];
};
static_assert(offsetof(Params, spare_field) == 4, "Params.spare_field offset");
constexpr int kUsed = 1;
constexpr int kSpare = 2;   // kSpare
template <int kWidth> __device__ __forceinline__ float group_max(float x) { return x; }
__device__ __forceinline__ uint32_t spare_helper(float a) { return 0; }
struct SpareType { int x; };
using spare_t = float;
__device__ void attention(const Params& p) { float y = group_max<kUsed>(p.used_field); }
extern "C" __global__ void entry(const Params p) { attention(p); }
const char* s = "spare_helper SpareType spare_t";
"""
    assert unused(source) == ["constant kSpare", "function spare_helper", "type SpareType", "alias spare_t",
                              "Params field spare_field"]


def test_rendering_leaves_out_what_nothing_names():
    """attngen.lean.drop_unnamed: a definition nothing names goes, with its own comment; one named
    only by a left-out definition goes too; overloads go or stay together; a paragraph's heading
    stays while any of its definitions does; braces inside strings do not end a definition; Params
    and entry points always stay."""
    from attngen.lean import drop_unnamed

    source = """namespace n {

// Sizes.
constexpr int kUsed = 1;
constexpr int kOnlyInDead = 2;   // kOnlyInDead
constexpr int kSpare = 3;

// Both go.
constexpr int kGone = 4;
constexpr int kGoneToo = 5;

struct Params { int x; };

__device__ __forceinline__ float to_f(int x) { return x; }
__device__ __forceinline__ float to_f(long x) { return x; }

// Its own comment.
template <int kN>
__device__ __forceinline__ void dead(uint32_t bar) {
    asm volatile("{\\n .reg .b64 s;\\n}\\n" :: "r"(bar + kOnlyInDead));
}

__device__ void attention(const Params& p) { int y = kUsed; }

}  // namespace n

extern "C" __global__ void entry(const n::Params p) { n::attention(p); }
"""
    out = drop_unnamed(source)
    for gone in ("kOnlyInDead", "kSpare", "kGone", "Both go", "to_f", "dead", "Its own comment"):
        assert gone not in out, gone
    for kept in ("// Sizes.", "kUsed = 1", "struct Params", "__device__ void attention", "extern \"C\""):
        assert kept in out, kept
    assert drop_unnamed(out) == out
