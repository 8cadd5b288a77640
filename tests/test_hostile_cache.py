"""The cubin cache against hostile entries: a read takes regular files of bounded size only (no
FIFO, device or link out of the cache), a manifest of any nesting is parsed without recursion, and
an entry counts only when its cubin is the one its source compiles to (kernels and Params) and its
report is the cubin's. Each case is a damaged entry, rebuilt within seconds, without a traceback.

Tests stand in for nvcc with fake_build (a small, well-formed cubin carrying the kernels a source
defines); those marked `nvcc` compile small real sources."""
from __future__ import annotations

import json
import os
import shutil
import struct
import sys
import time
from pathlib import Path

import pytest

from attngen import compile as compile_mod
from attngen import fsutil
from attngen.compile import CompileResult, parse_ptxas
from attngen import cubin as cubin_mod
from hostile_helpers import use_fake_nvcc

# -- a stand-in cubin -------------------------------------------------------------------------------

# The resources of FAKE_LOG's function, as a cubin records them.
FAKE_RESOURCES = {"registers": 96, "stack_bytes": 0, "smem_bytes": 29312, "barriers": 1}
FAKE_LOG_FUNCTION = """\
ptxas info    : Compiling entry function '{name}' for 'sm_89'
ptxas info    : Function properties for {name}
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 96 registers, used 1 barriers, 29312 bytes smem, 400 bytes cmem[0]
"""


def _record(attr: int, payload: bytes) -> bytes:
    return bytes([cubin_mod.SVAL, attr]) + struct.pack("<H", len(payload)) + payload


def fake_cubin(kernels: dict[str, int | None], resources=None) -> bytes:
    """A 64-bit ELF laid out as nvcc's cubins are, as far as attngen/cubin.py reads them: per kernel
    (name -> the byte size of its one parameter, None for none) a .text, a .nv.info with its
    parameter and barriers and a .nv.shared; registers and stack frame in .nv.info."""
    res = {**FAKE_RESOURCES, **(resources or {})}
    sections = [(".nv.info", 0x70000000, 0, b"")]      # filled in below
    common = b""
    for symbol, (name, size) in enumerate(sorted(kernels.items()), start=1):
        common += _record(cubin_mod.REGCOUNT, struct.pack("<II", symbol, res["registers"]))
        common += _record(cubin_mod.FRAME_SIZE, struct.pack("<II", symbol, res["stack_bytes"]))
        info = bytes([3, cubin_mod.NUM_BARRIERS]) + struct.pack("<H", res["barriers"])
        if size is not None:
            info += _record(cubin_mod.KPARAM_INFO, struct.pack("<IHHI", 0, 0, 0, size << 18 | 0xF000))
            info += _record(cubin_mod.PARAM_CBANK, struct.pack("<IHH", symbol, 0x210, size))
        sections.append((f".text.{name}", 1, 6, bytes(128), symbol))
        sections.append((f".nv.info.{name}", 0x70000000, 0x40, info))
        if res["smem_bytes"]:
            sections.append((f".nv.shared.{name}", cubin_mod.SHT_NOBITS, 0x43, res["smem_bytes"]))
    sections[0] = (".nv.info", 0x70000000, 0, common)
    names = b"\0.shstrtab\0" + b"".join(s[0].encode() + b"\0" for s in sections)
    body, headers = bytearray(), [struct.pack("<IIQQQQIIQQ", *[0] * 10)]
    at_name = lambda n: names.index(b"\0" + n.encode() + b"\0") + 1    # noqa: E731
    for name, kind, flags, data, *info in [(".shstrtab", 3, 0, names), *sections]:
        offset = 0x40 + len(body)
        size = data if isinstance(data, int) else len(data)
        if not isinstance(data, int):
            body += data
        headers.append(struct.pack("<IIQQQQIIQQ", at_name(name), kind, flags, 0, offset, size, 0,
                                   info[0] if info else 0, 1, 0))
    shoff = 0x40 + len(body)
    head = bytearray(0x40)
    head[:7] = b"\x7fELF\x02\x01\x01"
    struct.pack_into("<Q", head, 0x28, shoff)
    struct.pack_into("<HHH", head, 0x3A, 0x40, len(headers), 1)
    return bytes(head + body + b"".join(headers))


def fake_build(source: str) -> tuple[bytes, str]:
    """(cubin, ptxas log) of what nvcc would give for `source`: its kernels, FAKE_RESOURCES each."""
    kernels = compile_mod.source_kernels(source)
    log = "ptxas info    : 0 bytes gmem\n" + "".join(FAKE_LOG_FUNCTION.format(name=n) for n in sorted(kernels))
    return fake_cubin(kernels), log


FAKE_SOURCE = """\
struct Params { const void* q; int n; };
static_assert(sizeof(Params) == 16, "Params size must match attngen/core/abi.py");
extern "C" __global__ void __launch_bounds__(128, 1)
attngen_t_none(const Params p) {
}
"""
OTHER_SOURCE = FAKE_SOURCE.replace("attngen_t_none", "attngen_u_none")
WIDER_SOURCE = FAKE_SOURCE.replace("int n; }", "int n; long long m; }").replace("== 16", "== 24")


class FakeNvcc:
    """Stands in for compile.run_nvcc, building what fake_build gives; counts compiles."""

    def __init__(self):
        self.calls = 0

    def __call__(self, source, arch, nvcc):
        self.calls += 1
        cubin, log = fake_build(source)
        return CompileResult(arch, cubin, compile_mod.report_from_cubin(cubin, log), log, False)


@pytest.fixture
def fake_nvcc(monkeypatch, tmp_path):
    return use_fake_nvcc(monkeypatch, tmp_path, FakeNvcc())


def _entry(source=FAKE_SOURCE) -> Path:
    return compile_mod.cache_dir() / compile_mod.cache_key(source, "sm_89", "nvcc")


def _compile(source=FAKE_SOURCE, warnings=None):
    return compile_mod.compile_source(source, "sm_89", on_warning=(warnings.append if warnings is not None
                                                                   else lambda m: None))


def _rewrite_manifest(entry: Path, **changes) -> None:
    """Change manifest fields and make every hash in it agree again, as a careful forger would."""
    m = json.loads((entry / "manifest.json").read_text())
    m.update(changes)
    for name, field in (("kernel.cubin", "cubin"), ("ptxas.log", "log")):
        data = (entry / name).read_bytes()
        m[f"{field}_bytes"], m[f"{field}_sha256"] = len(data), compile_mod._sha256(data)
    m["entry_sha256"] = compile_mod._entry_sha256(m)
    (entry / "manifest.json").write_text(json.dumps(m))


def _rebuilt_within(seconds, fake_nvcc, source=FAKE_SOURCE):
    """Compile again after damage: one warning, nvcc run again, no hit; then the rebuilt entry hits."""
    warnings, calls, t0 = [], fake_nvcc.calls, time.monotonic()
    res = _compile(source, warnings)
    took = time.monotonic() - t0
    assert took < seconds, took
    assert not res.cached and fake_nvcc.calls == calls + 1, warnings
    assert len(warnings) >= 1 and all("damaged cache entry" in w for w in warnings), warnings
    again = _compile(source)
    assert again.cached and fake_nvcc.calls == calls + 1
    assert again.functions == res.functions
    return warnings, took


def test_fake_cubin_reads_as_nvcc_cubins_do():
    cubin, log = fake_build(FAKE_SOURCE)
    facts = cubin_mod.kernel_facts(cubin)
    assert set(facts) == {"attngen_t_none"} and facts["attngen_t_none"].params == ((0, 16),)
    assert compile_mod.report_from_cubin(cubin, log) == parse_ptxas(log)
    assert cubin_mod.param_layout(cubin) == {"attngen_t_none": (0, 16)}


def test_a_hit_is_served(fake_nvcc):
    first, again = _compile(), _compile()
    assert (first.cached, again.cached, fake_nvcc.calls) == (False, True, 1)
    assert again.functions == first.functions and again.functions[0].registers == 96


# -- item 3: reads are bounded --------------------------------------------------------------------

def _fifo(entry, name):
    (entry / name).unlink()
    os.mkfifo(entry / name)


def _dev_zero(entry, name):
    (entry / name).unlink()
    (entry / name).symlink_to("/dev/zero")


def _link_out(entry, name):
    outside = entry.parent.parent / f"outside-{name}"
    shutil.copy(entry / name, outside)
    (entry / name).unlink()
    (entry / name).symlink_to(outside)


def _directory(entry, name):
    (entry / name).unlink()
    (entry / name).mkdir()


def _huge(entry, name):
    with open(entry / name, "r+b") as f:          # sparse: costs no disk
        f.truncate(compile_mod.READ_LIMIT[name] + 1)


KINDS = {"fifo": _fifo, "dev_zero": _dev_zero, "link_out": _link_out, "directory": _directory, "huge": _huge}


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs and /dev/zero")
@pytest.mark.parametrize("name", ["kernel.cubin", "ptxas.log", "manifest.json"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_cache_file_that_is_not_a_bounded_regular_file(fake_nvcc, kind, name):
    # Before: a FIFO blocked the read forever; a link to /dev/zero read without bound.
    _compile()
    KINDS[kind](_entry(), name)
    warnings, took = _rebuilt_within(5, fake_nvcc)
    assert any(name in w for w in warnings), warnings
    print(f"{kind} {name}: rebuilt in {took:.3f} s")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_lock_that_is_a_fifo_or_a_link(fake_nvcc, tmp_path):
    _compile()
    lock = _entry() / ".lock"
    lock.unlink()
    os.mkfifo(lock)
    (_entry() / "kernel.cubin").write_bytes(b"damaged")   # a miss, so the lock is taken
    warnings, _ = _rebuilt_within(5, fake_nvcc)
    assert lock.is_file() and not lock.is_symlink()
    lock.unlink()
    lock.symlink_to(tmp_path / "created-elsewhere")
    (_entry() / "kernel.cubin").write_bytes(b"damaged")
    _compile()
    assert not (tmp_path / "created-elsewhere").exists() and lock.is_file() and not lock.is_symlink()


def test_entry_that_links_to_another_directory(fake_nvcc, tmp_path):
    # A link would send the rebuild's writes out of the cache (into another entry here).
    _compile(OTHER_SOURCE)
    _compile()
    shutil.rmtree(_entry())
    _entry().symlink_to(_entry(OTHER_SOURCE))
    before = sorted((p.name, p.read_bytes()) for p in _entry(OTHER_SOURCE).iterdir() if p.is_file())
    warnings = []
    res = _compile(warnings=warnings)
    assert not res.cached and fake_nvcc.calls == 3 and "symbolic link" in " ".join(warnings), warnings
    assert _entry().is_dir() and not _entry().is_symlink()
    assert sorted((p.name, p.read_bytes()) for p in _entry(OTHER_SOURCE).iterdir() if p.is_file()) == before


@pytest.mark.parametrize("depth", [100, 100000])
def test_deeply_nested_manifest(fake_nvcc, depth):
    # Before: a manifest nested 100000 deep raised RecursionError, and the entry was never rebuilt.
    _compile()
    (_entry() / "manifest.json").write_text("[" * depth + "]" * depth)
    warnings, took = _rebuilt_within(5, fake_nvcc)
    assert "not a valid manifest" in warnings[0]
    print(f"manifest nested {depth} deep: rebuilt in {took:.3f} s")


def test_deep_value_inside_a_valid_manifest(fake_nvcc):
    _compile()
    m = json.loads((_entry() / "manifest.json").read_text())
    (_entry() / "manifest.json").write_text(json.dumps({**m, "extra": "x"})[:-1] + ', "deep": '
                                            + "{\"a\": " * 50000 + "1" + "}" * 50000 + "}")
    _rebuilt_within(5, fake_nvcc)


@pytest.mark.parametrize("bad", [{"report": "x"}, {"report": [{"name": 1}]}, {"functions": "1"}, {"key": 5},
                                 {"report": [{"name": "attngen_t_none", "registers": -1, "spill_stores": 0,
                                              "spill_loads": 0, "stack_bytes": 0, "smem_bytes": 0, "barriers": 1}]},
                                 {"format": True}])
def test_manifest_fields_of_the_wrong_type(fake_nvcc, bad):
    _compile()
    _rewrite_manifest(_entry(), **bad)
    _rebuilt_within(5, fake_nvcc)


def test_json_depth_is_told_without_recursion():
    nested = '{"a": [1, {"b": "[[[[{{{"}]}'              # brackets inside strings do not nest
    assert fsutil.json_deeper_than(nested, 2) and not fsutil.json_deeper_than(nested, 3)
    assert fsutil.json_deeper_than("[" * 10 ** 6, 10 ** 6 - 1)
    assert not fsutil.json_deeper_than('"\\"[["', 0)
    assert not fsutil.json_deeper_than('"[[[', 0)          # an unterminated string to the end


def test_read_regular_refuses_without_blocking(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"12345")
    assert fsutil.read_regular(f, 5) == b"12345"
    with pytest.raises(fsutil.ReadRefused, match="over the 4 allowed"):
        fsutil.read_regular(f, 4)
    (tmp_path / "link").symlink_to(f)
    with pytest.raises(fsutil.ReadRefused, match="symbolic link"):
        fsutil.read_regular(tmp_path / "link", 100)
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo")
        with pytest.raises(fsutil.ReadRefused, match="FIFO"):
            fsutil.read_regular(tmp_path / "fifo", 100)
    with pytest.raises(FileNotFoundError):
        fsutil.read_regular(tmp_path / "missing", 100)


def test_read_regular_follows_a_link_only_when_asked(tmp_path):
    """Spec files, tables and reports a user names may be links; the cache's entries never are."""
    f = tmp_path / "f"
    f.write_bytes(b"12345")
    (tmp_path / "link").symlink_to(f)
    assert fsutil.read_regular(tmp_path / "link", 5, follow=True) == b"12345"
    (tmp_path / "zero").symlink_to("/dev/zero")
    with pytest.raises(fsutil.NotRegular, match="character device"):
        fsutil.read_regular(tmp_path / "zero", 100, follow=True)
    with pytest.raises(fsutil.TooLarge, match="over the 4 allowed"):
        fsutil.read_regular(tmp_path / "link", 4, follow=True)


# -- item 4: the cubin is this source's, and the report is the cubin's -----------------------------

def test_cubin_of_another_source_with_a_matching_manifest(fake_nvcc):
    # Before: served; the manifest proved the files whole, not that they were this source's.
    _compile(OTHER_SOURCE)
    _compile()
    for name in ("kernel.cubin", "ptxas.log"):
        shutil.copy(_entry(OTHER_SOURCE) / name, _entry() / name)
    _rewrite_manifest(_entry(), report=json.loads((_entry(OTHER_SOURCE) / "manifest.json").read_text())["report"])
    warnings, _ = _rebuilt_within(5, fake_nvcc)
    assert "not this source's" in warnings[0] and "attngen_u_none" in warnings[0], warnings
    assert _compile().functions[0].name == "attngen_t_none"


def test_whole_entry_of_another_source(fake_nvcc):
    _compile(OTHER_SOURCE)
    _compile()
    shutil.rmtree(_entry())
    shutil.copytree(_entry(OTHER_SOURCE), _entry())
    _rewrite_manifest(_entry(), key=_entry().name)
    warnings, _ = _rebuilt_within(5, fake_nvcc)
    assert "not this source's" in warnings[0]


def test_cubin_with_the_same_kernel_and_other_params(fake_nvcc):
    # The same kernel name, compiled from a source whose Params is 24 bytes, not 16.
    _compile(WIDER_SOURCE)
    _compile()
    for name in ("kernel.cubin", "ptxas.log"):
        shutil.copy(_entry(WIDER_SOURCE) / name, _entry() / name)
    _rewrite_manifest(_entry())
    warnings, _ = _rebuilt_within(5, fake_nvcc)
    assert "takes [24] bytes of parameters, not the source's Params of 16" in warnings[0], warnings


def test_edited_log_does_not_change_the_report(fake_nvcc):
    # Before: an edited ptxas.log (with its manifest hash) changed what `compile` reported.
    first = _compile()
    log = (_entry() / "ptxas.log").read_text()
    (_entry() / "ptxas.log").write_text(log.replace("Used 96 registers", "Used 32 registers")
                                        .replace("0 bytes spill stores", "8 bytes spill stores"))
    _rewrite_manifest(_entry())
    warnings, _ = _rebuilt_within(5, fake_nvcc)
    assert "ptxas.log does not report" in warnings[0], warnings
    assert _compile().functions == first.functions


def test_edited_report_in_the_manifest(fake_nvcc):
    _compile()
    report = json.loads((_entry() / "manifest.json").read_text())["report"]
    report[0]["registers"] = 32
    _rewrite_manifest(_entry(), report=report)           # hashes agree; the cubin says 96
    warnings, _ = _rebuilt_within(5, fake_nvcc)
    assert "not the one kernel.cubin records" in warnings[0], warnings


def test_edited_spills_without_the_entry_hash(fake_nvcc):
    _compile()
    m = json.loads((_entry() / "manifest.json").read_text())
    m["report"][0]["spill_stores"] = 0 if m["report"][0]["spill_stores"] else 64
    (_entry() / "manifest.json").write_text(json.dumps(m))
    warnings, _ = _rebuilt_within(5, fake_nvcc)
    assert "entry hash" in warnings[0], warnings


@pytest.mark.parametrize("cut", [0x40, 0x200, -0x40, -1])
def test_truncated_cubin_matching_its_manifest(fake_nvcc, cut):
    _compile()
    cubin = (_entry() / "kernel.cubin").read_bytes()
    (_entry() / "kernel.cubin").write_bytes(cubin[:cut])
    _rewrite_manifest(_entry())
    warnings, _ = _rebuilt_within(5, fake_nvcc)
    assert "kernel.cubin" in warnings[0]


def test_cubin_with_a_huge_nobits_section():
    cubin = bytearray(fake_cubin({"k": 16}))
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    _, shnum, _ = struct.unpack_from("<HHH", cubin, 0x3A)
    for i in range(shnum):
        if struct.unpack_from("<I", cubin, shoff + i * 64 + 4)[0] == cubin_mod.SHT_NOBITS:
            struct.pack_into("<Q", cubin, shoff + i * 64 + 32, 1 << 40)
    with pytest.raises(ValueError, match="NOBITS"):
        cubin_mod.kernel_facts(bytes(cubin))


def test_garbage_cubins_raise_value_error_only():
    import random
    rng = random.Random(63)
    good = fake_cubin({"k": 16})
    for _ in range(300):
        bad = bytearray(good)
        for _ in range(rng.randint(1, 8)):
            bad[rng.randrange(len(bad))] = rng.randrange(256)
        try:
            cubin_mod.kernel_facts(bytes(bad))
            cubin_mod.param_layout(bytes(bad))
        except ValueError:
            pass


def test_source_kernels_of_every_generated_file():
    root = Path(__file__).resolve().parents[1]
    for path in sorted((root / "generated").glob("*.cu")):
        source = path.read_text()
        kernels = compile_mod.source_kernels(source)
        assert kernels and len(kernels) == source.count("__global__"), path.name
        assert all(isinstance(size, int) and size > 0 for size in kernels.values()), path.name


def test_a_kernel_named_in_a_comment_is_not_expected():
    source = FAKE_SOURCE + '// extern "C" __global__ void attngen_x(const Params p) {}\n'
    assert set(compile_mod.source_kernels(source)) == {"attngen_t_none"}


# -- real cubins ------------------------------------------------------------------------------------

REAL_SOURCE = """\
struct Params { const float* a; float* b; int n; long long m; };
static_assert(sizeof(Params) == 32, "Params size must match attngen/core/abi.py");
extern "C" __global__ void __launch_bounds__(128, 2)
attngen_real_none(const Params p) {
    __shared__ float s[1000];
    s[threadIdx.x] = p.a[threadIdx.x];
    __syncthreads();
    p.b[threadIdx.x] = s[(threadIdx.x + 1) % 128];
}
extern "C" __global__ void __launch_bounds__(1024, 1)
attngen_real_spill(const Params p) {
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = p.a[i * p.n + threadIdx.x];
    for (int j = 0; j < p.n; ++j) {
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] = acc[i] * acc[(i + 7) & 63] + p.a[j];
    }
    float s = 0;
#pragma unroll
    for (int i = 0; i < 64; ++i) s += acc[i];
    p.b[threadIdx.x] = s;
}
"""


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_89", "sm_90a"])
def test_report_from_a_real_cubin_is_ptxas_report(arch):
    """Registers, stack frame, static shared memory (less sm_90's reserved window) and barriers
    read from the cubin are what ptxas printed, for a kernel with shared memory and one that spills."""
    res = compile_mod.compile_source(REAL_SOURCE.replace("1024, 1", "64, 16"), arch, use_cache=False)
    by_log = {f.name: f for f in parse_ptxas(res.log)}
    assert {f.name: f for f in res.functions} == by_log
    assert by_log["attngen_real_none"].smem_bytes == 4000 and by_log["attngen_real_none"].barriers == 1
    facts = cubin_mod.kernel_facts(res.cubin)
    assert all(f.params == ((0, 32),) for f in facts.values())
    assert compile_mod.plan_mismatch(facts, REAL_SOURCE) is None


@pytest.mark.nvcc
def test_real_cubin_of_another_source_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path / "cache"))
    other = REAL_SOURCE.replace("attngen_real_", "attngen_other_")
    compile_mod.compile_source(other, "sm_89")
    compile_mod.compile_source(REAL_SOURCE, "sm_89")
    nvcc = compile_mod.find_nvcc()
    mine = tmp_path / "cache" / compile_mod.cache_key(REAL_SOURCE, "sm_89", nvcc)
    theirs = tmp_path / "cache" / compile_mod.cache_key(other, "sm_89", nvcc)
    for name in ("kernel.cubin", "ptxas.log"):
        shutil.copy(theirs / name, mine / name)
    _rewrite_manifest(mine, report=json.loads((theirs / "manifest.json").read_text())["report"])
    warnings = []
    res = compile_mod.compile_source(REAL_SOURCE, "sm_89", on_warning=warnings.append)
    assert not res.cached and "not this source's" in warnings[0]
    assert {f.name for f in res.functions} == {"attngen_real_none", "attngen_real_spill"}
    assert compile_mod.compile_source(REAL_SOURCE, "sm_89").cached


def test_cli_compile_of_hostile_entries_is_one_line(fake_nvcc, tmp_path):
    """Through the CLI: a FIFO in the spec's entry is rebuilt, a warning line and exit 0."""
    from click.testing import CliRunner
    from attngen.cli import main
    spec = str(Path(__file__).resolve().parents[1] / "specs" / "phase4.yaml")
    runner = CliRunner()
    result = runner.invoke(main, ["compile", spec, "--arch", "sm_89"])
    assert result.exit_code == 0, result.output
    (entry,) = [d for d in (tmp_path / "cache").iterdir()]
    _fifo(entry, "kernel.cubin")
    t0 = time.monotonic()
    result = runner.invoke(main, ["compile", spec, "--arch", "sm_89"])
    assert time.monotonic() - t0 < 10
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert "damaged cache entry" in result.output and "attngen_phase4_none" in result.output
    print(result.output, file=sys.stderr)
