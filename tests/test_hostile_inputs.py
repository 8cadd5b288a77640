"""Hostile inputs: every bad spec file and bad option is one clean error line with exit 2, within
seconds, never a traceback or a hang; the cubin cache never uses a damaged entry; a write that
fails leaves the old file in place and is one clean line with exit 3.

None of these tests needs nvcc or a GPU: the cache tests stand in for nvcc, either by replacing
compile.run_nvcc in-process or with a small fake `nvcc` script on PATH for real processes.
"""
from __future__ import annotations

import errno
import itertools
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from attngen import compile as compile_mod
from attngen import fsutil
from attngen.compile import CompileResult, parse_ptxas
from attngen.errors import WriteError
from attngen.core.specio import MAX_SPEC_BYTES, suspicious_scalar
from hostile_helpers import assert_clean, error_lines, invoke, mini_project, use_fake_nvcc

ROOT = Path(__file__).resolve().parents[1]

# -- valid bases, one per family ----------------------------------------------------------------

SCALAR = """\
schema: 1
name: h_scalar
head_dim: 64
tile: {block_m: 32, block_n: 64}
warps: {compute: 4}
mma: scalar
smem: {swizzle: {pad_bytes: 4}}
"""
MMA = """\
schema: 1
name: h_mma
head_dim: 64
tile: {block_m: 64, block_n: 64}
warps: {compute: 4}
mma: mma_m16n8k16
smem: {swizzle: {xor_bits: 3}, stages: 2, async_copy: true, q_in_registers: true}
softmax: {rescale: on_max_change}
"""
WMMA = """\
schema: 1
name: h_wmma
head_dim: 64
tile: {block_m: 32, block_n: 64}
warps: {compute: 2}
mma: wmma_m16n16k16
smem: {swizzle: {pad_bytes: 16}}
"""
WS = """\
schema: 1
name: h_ws
head_dim: 128
tile: {block_m: 64, block_n: 32}
warps: {producer: 1, consumer: 4}
mma: mma_m16n8k16
smem: {swizzle: {xor_bits: 3}, stages: 3, async_copy: true}
"""


def edit(base: str, old: str, new: str) -> str:
    assert base.count(old) == 1, (old, base)
    return base.replace(old, new)


def alias_bomb(levels: int = 17) -> str:
    lines = ["schema: 1", "name: bomb", "a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


# name -> spec text (str or bytes). Each must be refused with exit 2 and one error line.
HOSTILE_SPECS: dict[str, str | bytes] = {
    # YAML syntax and shape
    "yaml_unclosed_flow": "schema: 1\nname: t\ntile: {block_m: 32\n",
    "yaml_bad_indent": "schema: 1\nname: t\n  head_dim: 64\n",
    "yaml_tab": SCALAR + "softmax:\n\trescale: always\n",
    "yaml_unterminated_quote": SCALAR + 'description: "never closed\n',
    "yaml_two_documents": SCALAR + "---\n" + SCALAR,
    "yaml_nul_byte": SCALAR + "\x00\n",
    "yaml_control_char": SCALAR + "description: a\x07b\n",
    "empty_file": "",
    "only_comments": "# nothing here\n",
    "top_level_list": "- schema\n- 1\n",
    "top_level_scalar": "just text\n",
    "not_utf8": b"schema: 1\nname: \xff\xfe\n",
    # wrong types and values
    "head_dim_text": edit(SCALAR, "head_dim: 64", "head_dim: sixty"),
    "head_dim_float": edit(SCALAR, "head_dim: 64", "head_dim: 64.0"),
    "stages_bool": edit(MMA, "stages: 2", "stages: true"),
    "async_copy_text": edit(MMA, "async_copy: true", "async_copy: maybe"),
    "name_number": edit(SCALAR, "name: h_scalar", "name: 5"),
    "name_pattern": edit(SCALAR, "name: h_scalar", "name: Bad-Name"),
    "masks_scalar": SCALAR + "masks: causal\n",
    "masks_empty": SCALAR + "masks: []\n",
    "masks_unknown": SCALAR + "masks: [none, sliding]\n",
    "masks_twice": SCALAR + "masks: [none, none]\n",
    "tile_scalar": edit(SCALAR, "tile: {block_m: 32, block_n: 64}", "tile: 32"),
    "warps_scalar": edit(SCALAR, "warps: {compute: 4}", "warps: 4"),
    "swizzle_text": edit(SCALAR, "smem: {swizzle: {pad_bytes: 4}}", "smem: {swizzle: xor}"),
    "target_unknown": SCALAR + "target: v100\n",
    "schema_2": edit(SCALAR, "schema: 1", "schema: 2"),
    "schema_missing": edit(SCALAR, "schema: 1\n", ""),
    "block_m_too_big": edit(SCALAR, "block_m: 32", "block_m: 512"),
    "block_n_zero": edit(SCALAR, "block_n: 64", "block_n: 0"),
    "head_dim_negative": edit(SCALAR, "head_dim: 64", "head_dim: -64"),
    "min_blocks_zero": SCALAR + "min_blocks_per_sm: 0\n",
    "unknown_key": SCALAR + "head_dims: 64\n",
    "missing_key": edit(SCALAR, "mma: scalar\n", ""),
    "duplicate_key": SCALAR + "head_dim: 128\n",
    "null_key": SCALAR + "~: 1\n",
    "int_key": SCALAR + "1: 2\n",
    "list_key": SCALAR + "? [a]\n: 1\n",
    # every cross-field rule that a spec file can reach
    "rule_head_dim_8": edit(MMA, "head_dim: 64", "head_dim: 68"),
    "rule_head_dim_16": edit(MMA, "head_dim: 64", "head_dim: 72"),
    "rule_scalar_head_dim": edit(SCALAR, "head_dim: 64", "head_dim: 96"),
    "rule_block_m_split": edit(MMA, "block_m: 64", "block_m: 48"),
    "rule_block_n": edit(SCALAR, "block_n: 64", "block_n: 48"),
    "rule_stages_need_async": edit(MMA, "async_copy: true", "async_copy: false"),
    "rule_async_needs_tc": edit(SCALAR, "smem: {swizzle: {pad_bytes: 4}}",
                                "smem: {swizzle: {pad_bytes: 4}, async_copy: true}"),
    "rule_q_in_registers": edit(WMMA, "smem: {swizzle: {pad_bytes: 16}}",
                                "smem: {swizzle: {pad_bytes: 16}, q_in_registers: true}"),
    "rule_xor_family": edit(WMMA, "swizzle: {pad_bytes: 16}", "swizzle: {xor_bits: 2}"),
    "rule_pad_4": edit(SCALAR, "pad_bytes: 4", "pad_bytes: 6"),
    "rule_pad_16": edit(WMMA, "pad_bytes: 16", "pad_bytes: 8"),
    "rule_xor_bits": edit(MMA, "xor_bits: 3", "xor_bits: 4").replace("head_dim: 64", "head_dim: 32"),
    "rule_producer_family": edit(WS, "mma: mma_m16n8k16\nsmem: {swizzle: {xor_bits: 3}, stages: 3, async_copy: true}",
                                 "mma: wmma_m16n16k16\nsmem: {swizzle: {pad_bytes: 16}}"),
    "rule_producer_async": edit(WS, "stages: 3, async_copy: true", "stages: 1"),
    "rule_producer_stages": edit(WS, "stages: 3", "stages: 1"),
    "rule_rescale": SCALAR + "softmax: {rescale: on_max_change}\n",
    "rule_rescale_wmma": WMMA + "softmax: {rescale: on_max_change}\n",
    # shared memory over budget (a table follows the error line)
    "over_budget": edit(MMA, "block_m: 64, block_n: 64", "block_m: 128, block_n: 128").replace(
        "head_dim: 64", "head_dim: 256").replace("warps: {compute: 4}", "warps: {compute: 8}"),
    "over_opt_in_budget": edit(MMA, "block_m: 64, block_n: 64", "block_m: 128, block_n: 128").replace(
        "head_dim: 64", "head_dim: 256").replace("warps: {compute: 4}", "warps: {compute: 8}").replace(
        "q_in_registers: true}", "q_in_registers: true, opt_in: true}"),
    # anchors, aliases, tags
    "alias_bomb": alias_bomb(17),
    "anchor_and_alias": SCALAR + "x: &t {block_m: 32}\ny: *t\n",
    "merge_key": edit(SCALAR, "tile: {block_m: 32, block_n: 64}", "base: &b {block_m: 32, block_n: 64}\ntile: {<<: *b}"),
    "tag_python": SCALAR + "description: !!python/object/apply:os.system [echo]\n",
    "tag_int": edit(SCALAR, "head_dim: 64", "head_dim: !!int 0100"),
    "tag_local": edit(SCALAR, "head_dim: 64", "head_dim: !custom 64"),
    # nesting
    "deep_flow_10000": SCALAR + "x: " + "[" * 10000 + "]" * 10000 + "\n",
    "deep_block": SCALAR + "".join("  " * i + f"k{i}:\n" for i in range(40)) + "  " * 40 + "v: 1\n",
    # YAML 1.1 number and boolean forms where an int or bool is expected
    "int_octal_0100": edit(SCALAR, "block_m: 32", "block_m: 0100"),
    "int_octal_040": edit(SCALAR, "block_m: 32", "block_m: 040"),
    "int_leading_zero_0128": edit(SCALAR, "block_m: 32", "block_m: 0128"),
    "int_hex": edit(SCALAR, "block_m: 32", "block_m: 0x20"),
    "int_octal_0o": edit(SCALAR, "block_m: 32", "block_m: 0o40"),
    "int_binary": edit(SCALAR, "block_m: 32", "block_m: 0b100000"),
    "int_sexagesimal": edit(SCALAR, "head_dim: 64", "head_dim: 1:04"),
    "int_underscore": edit(SCALAR, "head_dim: 64", "head_dim: 6_4"),
    "int_exponent_1e2": edit(SCALAR, "head_dim: 64", "head_dim: 1e2"),
    "int_exponent_64e0": edit(SCALAR, "head_dim: 64", "head_dim: 64e0"),
    "int_inf": edit(SCALAR, "head_dim: 64", "head_dim: .inf"),
    "int_minus_inf": edit(SCALAR, "head_dim: 64", "head_dim: -.inf"),
    "int_nan": edit(SCALAR, "head_dim: 64", "head_dim: .nan"),
    "int_5000_digits": edit(SCALAR, "head_dim: 64", "head_dim: " + "9" * 5000),
    # number forms without a value: no digits, or none that a float can hold
    "int_hex_no_digits": edit(SCALAR, "block_m: 32", "block_m: 0x_"),
    "int_binary_no_digits": edit(SCALAR, "block_m: 32", "block_m: 0b_"),
    "int_octal_0o_no_digits": edit(SCALAR, "block_m: 32", "block_m: 0o_"),
    "int_octal_0o_signed_no_digits": edit(SCALAR, "block_m: 32", "block_m: -0o__"),
    "int_exponent_overflow": edit(SCALAR, "head_dim: 64", "head_dim: 1_0e400"),
    "text_hex_no_digits": SCALAR + "description: 0x_\n",
    "text_binary_no_digits": SCALAR + "description: 0b_\n",
    "text_exponent_overflow": SCALAR + "description: 1_0e400\n",
    "bool_yes": edit(MMA, "async_copy: true", "async_copy: yes"),
    "bool_on": edit(MMA, "q_in_registers: true", "q_in_registers: on"),
    "bool_off": edit(MMA, "async_copy: true", "async_copy: off"),
    "bool_No": edit(MMA, "q_in_registers: true", "q_in_registers: No"),
    "bool_y": edit(MMA, "async_copy: true", "async_copy: y"),
}

# What the message must say for the cases this hardening is about (value as written, the fix).
EXPECTED = {
    "int_octal_0100": ["0100", "octal", "write 64"],
    "int_octal_040": ["040", "write 32"],
    "int_leading_zero_0128": ["0128", "write 128"],
    "int_hex": ["0x20", "write 32"],
    "int_octal_0o": ["0o40", "write 32"],
    "int_binary": ["0b100000", "write 32"],
    "int_sexagesimal": ["1:04", "base-60", "write 64"],
    "int_underscore": ["6_4", "write 64"],
    "int_exponent_1e2": ["1e2", "write 100"],
    "int_exponent_64e0": ["64e0", "write 64"],
    "int_inf": [".inf"],
    "int_nan": [".nan"],
    "int_5000_digits": ["5000 digits"],
    "rule_q_in_registers": ["smem.q_in_registers: Q fragments in registers are not generated for wmma_m16n16k16"],
    "rule_xor_family": ["smem.swizzle: the XOR swizzle is not generated for wmma_m16n16k16"],
    "rule_producer_family": ["warps.producer: producer/consumer warp roles are not generated for wmma_m16n16k16"],
    "rule_rescale": ["softmax.rescale: rescaling only when a row's max changes is not generated for scalar"],
    "rule_rescale_wmma": ["softmax.rescale: rescaling only when a row's max changes is not generated for "
                          "wmma_m16n16k16; set softmax.rescale: always"],
    "int_hex_no_digits": ["0x_ is a hexadecimal number; integers are plain decimal (quote it"],
    "int_binary_no_digits": ["0b_ is a binary number; integers are plain decimal (quote it"],
    "int_octal_0o_no_digits": ["tile.block_m", "valid integer", "'0o_'"],
    "int_octal_0o_signed_no_digits": ["tile.block_m", "valid integer", "'-0o__'"],
    "int_exponent_overflow": ["1_0e400 is a number with digit separators or an exponent; integers are plain decimal "
                              "digits only (quote it"],
    "text_hex_no_digits": ["description: 0x_ is a hexadecimal number"],
    "text_binary_no_digits": ["description: 0b_ is a binary number"],
    "text_exponent_overflow": ["description: 1_0e400 is a number"],
    "bool_yes": ["yes", "true or false"],
    "bool_on": ["on", "true or false"],
    "bool_off": ["off", "true or false"],
    "alias_bomb": ["anchor", "not allowed"],
    "anchor_and_alias": ["anchor &t"],
    "merge_key": ["anchor &b"],
    "tag_python": ["tag", "not allowed"],
    "tag_int": ["!!int"],
    "deep_flow_10000": ["nested more than"],
    "deep_block": ["nested more than"],
    "yaml_nul_byte": ["U+0000"],
    "yaml_two_documents": ["single document"],
    "not_utf8": ["not UTF-8", "0xff"],
    "null_key": ["key '~'"],
}


def test_corpus_is_large_enough():
    assert len(HOSTILE_SPECS) + len(HOSTILE_OPTIONS) >= 60


# -- running the CLI ----------------------------------------------------------------------------

def write_spec(tmp_path: Path, name: str, content) -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return p


@pytest.mark.parametrize("command", ["build", "explain", "check"])
@pytest.mark.parametrize("name", sorted(HOSTILE_SPECS))
def test_hostile_spec(tmp_path, name, command):
    if command == "check":
        specs = tmp_path / "specs"
        specs.mkdir()
        p = write_spec(specs, name, HOSTILE_SPECS[name])
        args = ["check", "--specs-dir", specs, "--generated", tmp_path / "gen"]
    else:
        p = write_spec(tmp_path, name, HOSTILE_SPECS[name])
        args = [command, p] + (["--out", tmp_path / "gen"] if command == "build" else [])
    line = assert_clean(*invoke(args))
    assert line.startswith(str(p)), line          # names the file (and the line, where there is one)
    for fragment in EXPECTED.get(name, []):
        assert fragment in line, (fragment, line)
    assert not (tmp_path / "gen").exists() or not any((tmp_path / "gen").iterdir())


def test_octal_is_not_read_as_64(tmp_path):
    # YAML 1.1 reads 0100 as 64: the kernel would get kBlockM = 64 while the header shows 0100.
    p = write_spec(tmp_path, "octal", edit(MMA, "block_m: 64", "block_m: 0100"))
    line = assert_clean(*invoke(["build", p, "--out", tmp_path / "gen"]))
    assert f"{p}:4: tile.block_m: 0100 is a YAML 1.1 octal number (64)" in line


def test_plain_decimal_and_yaml_1_2_booleans_still_load(tmp_path):
    text = edit(MMA, "async_copy: true", "async_copy: True").replace("stages: 2", "stages: +2")
    p = write_spec(tmp_path, "ok", text + "description: '0100 yes on 1:04'\n")
    code, out, err, exc, _ = invoke(["build", p, "--out", tmp_path / "gen"])
    assert code == 0, err
    assert (tmp_path / "gen" / "h_mma.cu").is_file()


def test_number_form_without_a_value_is_text_where_text_is_expected(tmp_path):
    # `0o_` is text to YAML 1.1 (no 0o form) and to YAML 1.2 (0o needs a digit): a description may
    # say it. `0x_` and `0b_` are refused (see HOSTILE_SPECS): YAML 1.1 takes them for integers and
    # cannot convert them, so a file holding them does not load there.
    for i, value in enumerate(["0o_", "-0o__", "_", "0:30"]):
        p = write_spec(tmp_path, f"text{i}", SCALAR + f"description: {value}\n")
        code, out, err, exc, _ = invoke(["build", p, "--out", tmp_path / "gen"])
        assert code == 0 and "Traceback" not in err, (value, err)
        assert f"{value}" in (tmp_path / "gen" / "h_scalar.cu").read_text()


def test_suspicious_scalar_never_raises_and_never_names_a_non_number():
    # Every plain scalar of up to 3 characters made of number-form pieces, and some longer ones:
    # the check answers None or (problem, fix); a fix never says `write inf`, `write nan` or `None`.
    alphabet = "0179_-+.eExob:"
    values = ["".join(p) for n in range(1, 4) for p in itertools.product(alphabet, repeat=n)]
    values += ["0o_", "-0o__", "0x_", "0b_", "+0x__", "1_0e400", "1e400", "-9e999", "0x" + "f" * 60, "1" + "0" * 60,
               "1e19", "1_0e-400", "0o" + "7" * 60]
    for value in values:
        found = suspicious_scalar(value)
        if found is not None:
            what, fix = found
            assert not re.search(r"\b(inf|nan|None)\b", what + " " + fix), (value, found)
    assert suspicious_scalar("1e400") == ("a number with digit separators or an exponent",
                                          "integers are plain decimal digits only")
    assert suspicious_scalar("0o40") == ("an octal number (32)", "integers are plain decimal: write 32")


# -- files that are not small regular files --------------------------------------------------------

def _spec_path_cases(tmp_path: Path) -> dict[str, Path]:
    cases = {"directory": tmp_path / "dir.yaml", "missing": tmp_path / "missing.yaml",
             "too_large": tmp_path / "large.yaml", "huge_sparse": tmp_path / "huge.yaml"}
    cases["directory"].mkdir()
    cases["too_large"].write_text(SCALAR + "# " + "x" * MAX_SPEC_BYTES + "\n")
    with open(cases["huge_sparse"], "wb") as f:        # 50 MB without writing 50 MB
        f.truncate(50 * 1024 * 1024)
    if hasattr(os, "mkfifo"):
        cases["fifo"] = tmp_path / "fifo.yaml"
        os.mkfifo(cases["fifo"])
    if Path("/dev/zero").exists():
        cases["dev_zero"] = Path("/dev/zero")
    return cases


PATH_CASES = ["directory", "missing", "too_large", "huge_sparse", "fifo", "dev_zero"]


def _cli_env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


@pytest.mark.parametrize("case", PATH_CASES)
def test_spec_path_is_not_a_small_regular_file(tmp_path, case):
    # A real process with a timeout: a FIFO or /dev/zero used to hang or exhaust memory.
    paths = _spec_path_cases(tmp_path)
    if case not in paths:
        pytest.skip(f"{case} is not available on this system")
    p = paths[case]
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "attngen", "explain", str(p)], capture_output=True, text=True,
                          cwd=tmp_path, env=_cli_env(), timeout=30)
    line = assert_clean(proc.returncode, proc.stdout, proc.stderr, None, time.monotonic() - start)
    assert str(p) in line
    if case in ("too_large", "huge_sparse"):
        assert f"at most {MAX_SPEC_BYTES} bytes" in line
    if case in ("fifo", "dev_zero"):
        assert "not a regular file" in line


def test_alias_bomb_in_a_real_process(tmp_path):
    p = write_spec(tmp_path, "bomb", alias_bomb(17))
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "attngen", "build", str(p), "--out", str(tmp_path / "gen")],
                          capture_output=True, text=True, cwd=tmp_path, env=_cli_env(), timeout=60)
    line = assert_clean(proc.returncode, proc.stdout, proc.stderr, None, time.monotonic() - start)
    assert "anchor &a0 is not allowed" in line


def test_deep_nesting_in_a_real_process(tmp_path):
    p = write_spec(tmp_path, "deep", HOSTILE_SPECS["deep_flow_10000"])
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "attngen", "check", "--specs-dir", str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path, env=_cli_env(), timeout=60)
    line = assert_clean(proc.returncode, proc.stdout, proc.stderr, None, time.monotonic() - start)
    assert "nested more than" in line and "RecursionError" not in proc.stderr


# -- options --------------------------------------------------------------------------------------

def _spec(path="specs/phase4.yaml") -> str:
    return str(ROOT / path)


HOSTILE_OPTIONS = {
    "bench_shapes_two_dims": ["bench", "--shapes", "1x2"],
    "bench_shapes_zero": ["bench", "--shapes", "0x0x0x64"],
    "bench_shapes_six_dims": ["bench", "--shapes", "1x2x3x4x5x6"],
    "bench_shapes_letters": ["bench", "--shapes", "axbxcxd"],
    "bench_shapes_negative": ["bench", "--shapes", "1x-2x64x64"],
    "bench_shapes_empty_item": ["bench", "--shapes", "4x16x2048x64,"],
    "bench_reps_zero": ["bench", "--reps", "0"],
    "bench_reps_negative": ["bench", "--reps", "-5"],
    "bench_reps_text": ["bench", "--reps", "many"],
    "bench_backend_unknown": ["bench", "--backends", "flash,magic"],
    "bench_backend_none": ["bench", "--backends", ","],
    "bench_plot_suffix": ["bench", "--plot", "bench.jpeg"],
    "explain_arch_bogus": ["explain", _spec(), "--arch", "bogus"],
    "explain_arch_number": ["explain", _spec(), "--arch", "89"],
    "explain_arch_sm_100": ["explain", _spec(), "--arch", "sm_100"],
    "explain_arch_other_target": ["explain", _spec(), "--arch", "sm_90"],
    "compile_arch_bogus": ["compile", _spec(), "--arch", "bogus"],
    "compile_arch_number": ["compile", _spec(), "--arch", "89"],
    "compile_arch_second_bad": ["compile", _spec(), "--arch", "sm_89", "--arch", "sm_"],
    "build_unknown_option": ["build", "--frobnicate"],
    "check_no_specs": ["check", "--specs-dir", "/nonexistent-attngen-specs"],
    # options that fit none of the specs: refused before any GPU check (exit 2, even with no torch)
    "bench_cells_empty": ["bench", "--cells", ",,", _spec("specs/h200_decode_d128.yaml")],
    "bench_cells_huge": ["bench", "--cells", "1x32/8x99999999999999x1", _spec("specs/h200_decode_d128.yaml")],
    "bench_cells_forward_only": ["bench", "--cells", "1x32/8x1024x1", _spec("specs/l4_mma_d64.yaml")],
    "bench_varlen_spec_without": ["bench", "--varlen", _spec("specs/l4_mma_d64.yaml")],
    "bench_varlen_decode_only": ["bench", "--varlen", _spec("specs/h200_decode_d128.yaml")],
    "bench_paged_contiguous_spec": ["bench", "--paged", _spec("specs/h200_decode_d128_contiguous.yaml"),
                                    _spec("specs/h200_decode_d128_contiguous_bf16.yaml")],
    "sweep_decode_spec": ["sweep", _spec("specs/h200_decode_d128.yaml"), "--shapes", "1x8x512x128"],
}

OPTION_MESSAGES = {
    "bench_cells_empty": "name at least one cell",
    "bench_cells_huge": "Sk must be at most 4194304",
    "bench_cells_forward_only": "--cells applies to decode specs",
    "bench_varlen_spec_without": "l4_mma_d64 has none (give specs with varlen: true)",
    "bench_varlen_decode_only": "--varlen applies to forward specs",
    "bench_paged_contiguous_spec": "h200_decode_d128_contiguous, h200_decode_d128_contiguous_bf16 read contiguous caches only",
    "sweep_decode_spec": "decode_mma specs declare none",
}


@pytest.mark.parametrize("name", sorted(HOSTILE_OPTIONS))
def test_hostile_option(name, monkeypatch):
    # Refused while parsing, before any GPU, nvcc or spec work: a stub makes that visible.
    def no_compile(*a, **kw):
        raise AssertionError("compiled despite a bad option")
    monkeypatch.setattr(compile_mod, "compile_source", no_compile)
    code, out, err, *rest = invoke(HOSTILE_OPTIONS[name])
    line = assert_clean(code, out, err, *rest)
    assert line.startswith("Error:"), line
    assert code == 2, (code, line)
    if name in OPTION_MESSAGES:
        assert OPTION_MESSAGES[name] in line, line


def test_explain_arch_of_another_target_says_why(monkeypatch):
    monkeypatch.setattr(compile_mod, "compile_source", lambda *a, **kw: pytest.fail("compiled"))
    line = assert_clean(*invoke(["explain", _spec(), "--arch", "sm_90"]))
    assert "target l4 (sm_89)" in line and "--arch sm_89" in line


def test_build_out_is_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    assert_clean(*invoke(["build", _spec(), "--out", f]))


# -- build: every bad spec reported, duplicate names refused ------------------------------------------

def test_build_reports_every_bad_spec_and_builds_the_rest(tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    write_spec(specs, "a_bad", HOSTILE_SPECS["int_hex"])
    write_spec(specs, "b_good", SCALAR)
    write_spec(specs, "c_bad", HOSTILE_SPECS["rule_block_n"].replace("h_scalar", "h_other"))
    write_spec(specs, "d_good", WMMA)
    code, out, err, exc, _ = invoke(["build", "--specs-dir", specs, "--out", tmp_path / "gen"])
    assert code == 2 and "Traceback" not in err
    lines = error_lines(err)
    assert len(lines) == 2 and "a_bad.yaml" in lines[0] and "c_bad.yaml" in lines[1], err
    assert sorted(p.name for p in (tmp_path / "gen").glob("*.cu")) == ["h_scalar.cu", "h_wmma.cu"]
    assert out.splitlines()[-1] == "attngen build: 2 files, 2 written, 0 unchanged, 2 refused (4 specs)"


def test_build_refuses_duplicate_names(tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    a = write_spec(specs, "a", SCALAR)
    b = write_spec(specs, "b", SCALAR.replace("block_m: 32", "block_m: 64"))
    write_spec(specs, "c", WMMA)
    code, out, err, exc, _ = invoke(["build", "--specs-dir", specs, "--out", tmp_path / "gen"])
    assert code == 2
    (line,) = error_lines(err)
    assert line.startswith(f"{a}:2: name: 'h_scalar' is also the name of {b}"), line
    assert "h_scalar.cu" in line
    assert [p.name for p in (tmp_path / "gen").glob("*.cu")] == ["h_wmma.cu"]   # nothing for the clash


def test_build_takes_one_spec_given_twice_once(tmp_path, monkeypatch):
    # Before: `build s.yaml ./s.yaml` refused s.yaml as a duplicate name of itself, exit 2.
    monkeypatch.chdir(tmp_path)
    p = write_spec(tmp_path, "s", SCALAR)
    (tmp_path / "link.yaml").symlink_to(p)
    for args in (["s.yaml", "s.yaml"], ["s.yaml", "./s.yaml"], ["s.yaml", str(p)], ["s.yaml", "link.yaml"]):
        code, out, err, exc, _ = invoke(["build", *args, "--out", "gen", "--json"])
        assert code == 0 and not error_lines(err), (args, err)
        report = json.loads(out)
        assert [f["spec"] for f in report["files"]] == ["s.yaml"], args
    assert [f.name for f in (tmp_path / "gen").glob("*.cu")] == ["h_scalar.cu"]


def test_check_takes_a_linked_spec_once(tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    p = write_spec(specs, "a", SCALAR)
    (specs / "b.yaml").symlink_to(p)
    code, out, err, exc, _ = invoke(["build", "--specs-dir", specs, "--out", tmp_path / "gen"])
    assert code == 0, err
    code, out, err, exc, _ = invoke(["check", "--specs-dir", specs, "--generated", tmp_path / "gen"])
    assert code == 0 and "1 generated file(s) in sync" in out, out + err


def test_check_reports_duplicate_names_and_every_bad_spec(tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    write_spec(specs, "a", SCALAR)
    write_spec(specs, "b", SCALAR)
    write_spec(specs, "c", HOSTILE_SPECS["bool_yes"])
    code, out, err, exc, _ = invoke(["check", "--specs-dir", specs, "--generated", tmp_path / "gen"])
    assert code == 2 and "Traceback" not in err
    lines = error_lines(err)
    assert any("c.yaml" in ln and "yes" in ln for ln in lines)
    assert any("also the name of" in ln for ln in lines)


def test_build_and_check_json(tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    write_spec(specs, "a", SCALAR)
    write_spec(specs, "b", HOSTILE_SPECS["int_octal_0100"].replace("h_scalar", "h_b"))
    gen = tmp_path / "gen"
    code, out, err, exc, _ = invoke(["build", "--specs-dir", specs, "--out", gen, "--json"])
    assert code == 2
    report = json.loads(out)
    assert report["ok"] is False
    assert [(f["file"], f["status"]) for f in report["files"]] == [(str(gen / "h_scalar.cu"), "written")]
    (e,) = report["errors"]
    assert e["spec"].endswith("b.yaml") and e["key"] == "tile.block_m" and e["line"] == 4
    (specs / "b.yaml").unlink()
    code, out, err, exc, _ = invoke(["build", "--specs-dir", specs, "--out", gen, "--json"])
    assert code == 0 and json.loads(out)["files"][0]["status"] == "unchanged"
    (gen / "orphan.cu").write_text("")
    code, out, err, exc, _ = invoke(["check", "--specs-dir", specs, "--generated", gen, "--json"])
    report = json.loads(out)
    assert code == 1 and report["ok"] is False
    assert [f["file"] for f in report["in_sync"]] == [str(gen / "h_scalar.cu")]
    assert report["orphans"] == [{"file": str(gen / "orphan.cu")}]
    (gen / "orphan.cu").unlink()
    (gen / "h_scalar.cu").write_bytes(b"\xff\xfe not what the spec renders\n")   # not even UTF-8
    code, out, err, exc, _ = invoke(["check", "--specs-dir", specs, "--generated", gen, "--json"])
    report = json.loads(out)
    assert code == 1 and report["stale"][0]["file"] == str(gen / "h_scalar.cu") and report["stale"][0]["diff"]


# -- writes that fail: the old file stays, one line, exit 3 ---------------------------------------

def _enospc_after_half(fd, data):
    os.write(fd, bytes(data[: len(data) // 2]))
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_build_on_a_full_disk_leaves_the_old_file(tmp_path, monkeypatch):
    gen = tmp_path / "gen"
    gen.mkdir()
    old = "// an older rendering\n"
    (gen / "h_scalar.cu").write_text(old)
    p = write_spec(tmp_path, "s", SCALAR)
    monkeypatch.setattr(fsutil, "_write_all", _enospc_after_half)
    line = assert_clean(*invoke(["build", p, "--out", gen]), exit_code=3)
    assert line == f"attngen: cannot write {gen / 'h_scalar.cu'}: No space left on device"
    assert (gen / "h_scalar.cu").read_text() == old
    assert [f.name for f in gen.iterdir()] == ["h_scalar.cu"]      # no temporary file left behind


def test_build_into_an_unwritable_directory(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    p = write_spec(tmp_path, "s", SCALAR)
    line = assert_clean(*invoke(["build", p, "--out", blocker / "gen"]), exit_code=3)
    assert line.startswith(f"attngen: cannot create directory {blocker / 'gen'}")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes into read-only directories")
def test_build_into_a_read_only_directory(tmp_path):
    gen = tmp_path / "gen"
    gen.mkdir()
    gen.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        p = write_spec(tmp_path, "s", SCALAR)
        line = assert_clean(*invoke(["build", p, "--out", gen]), exit_code=3)
        assert "Permission denied" in line
    finally:
        gen.chmod(stat.S_IRWXU)


# -- reports: verify --json, bench --plot (sweep's in test_sweep.py) ------------------------------------

def _verify_case(variant="none", passed=True):
    from attngen.eval.verify import CaseResult, Shape
    return CaseResult("phase4", "attngen_phase4_none", variant, Shape(1, 2, 2, 17, 17, "bshd"), passed,
                      1e-4, 1e-4, 3e-4, 1e-6, 0.1, [] if passed else ["max err exceeds the bound"])


@pytest.fixture
def stub_verify(monkeypatch):
    """`attngen verify` without a GPU: no kernel is loaded and the report holds the given cases."""
    from attngen.eval import verify as verify_mod
    cases = [_verify_case()]
    monkeypatch.setattr(verify_mod, "load_kernels", lambda paths, on_compile=None: [object()])
    monkeypatch.setattr(verify_mod, "case_count", lambda kernels, shapes: len(cases))
    monkeypatch.setattr(verify_mod, "verify_kernels", lambda kernels, shapes, suite_name, seed, on_case: (
        verify_mod.VerifyReport("Stub GPU", "sm_90", "stub", suite_name, list(cases))))
    return cases


def test_verify_json_is_written_atomically(stub_verify, tmp_path, monkeypatch):
    report = tmp_path / "verify.json"
    code, out, err, exc, _ = invoke(["verify", _spec(), "--quick", "--json", report])
    assert code == 0, err
    assert json.loads(report.read_text())["passed"] == 1
    old = report.read_text()
    monkeypatch.setattr(fsutil, "_write_all", _enospc_after_half)
    line = assert_clean(*invoke(["verify", _spec(), "--quick", "--json", report]), exit_code=3)
    assert line == f"attngen: cannot write {report}: No space left on device"
    assert report.read_text() == old and [p.name for p in tmp_path.iterdir()] == ["verify.json"]


def test_verify_table_columns_fit_every_variant(stub_verify):
    # Before: a fixed 7-character variant column; causal:bottom_right (19) pushed its row's shape,
    # errors and result out of line with the header and the other rows.
    stub_verify[:] = [_verify_case("none"), _verify_case("causal:top_left"),
                      _verify_case("causal:bottom_right", passed=False)]
    code, out, err, exc, _ = invoke(["verify", _spec(), "--quick"])
    assert code == 1, err
    lines = out.splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.startswith("spec "))
    rows = lines[header + 1: header + 4]
    assert [r.split()[1] for r in rows] == ["none", "causal:top_left", "causal:bottom_right"]
    for column in ("shape", "layout", "result"):
        at = lines[header].index(column)
        assert all(r[at - 1] == " " and r[at] != " " for r in rows), (column, lines[header:header + 4])
    assert all(r.index("B1 H2 Sq17 Sk17") == lines[header].index("shape") for r in rows)


def test_verify_json_into_a_missing_directory(stub_verify, tmp_path):
    # Before: FileNotFoundError from Path.write_text, a traceback after the whole run.
    line = assert_clean(*invoke(["verify", _spec(), "--json", tmp_path / "no" / "verify.json"]), exit_code=3)
    assert line == f"attngen: cannot write {tmp_path / 'no' / 'verify.json'}: No such file or directory"


def _bench_report():
    from attngen.eval.bench import BenchReport, Case, CaseResult, Timing
    return BenchReport("Stub GPU", {"torch": "stub", "cuda": "0", "driver": "0"}, [
        CaseResult(Case(1, 8, 512, 64, "fp16", False), [Timing("phase4", 50.0, 10.7, 1.0),
                                                        Timing("sdpa:flash", 40.0, 13.4, 1.0)])])


def test_bench_plot_is_written_atomically(tmp_path, monkeypatch):
    from attngen.eval.bench import chart
    monkeypatch.setattr(chart, "plot_image", lambda report, fmt="png", call="": b"\x89PNG " + fmt.encode())
    path = tmp_path / "bench.png"
    chart.plot(_bench_report(), path)
    assert path.read_bytes() == b"\x89PNG png"
    monkeypatch.setattr(fsutil, "_write_all", _enospc_after_half)
    with pytest.raises(WriteError, match="No space left on device"):
        chart.plot(_bench_report(), path)
    assert path.read_bytes() == b"\x89PNG png" and [p.name for p in tmp_path.iterdir()] == ["bench.png"]


def test_bench_plot_into_a_missing_directory(tmp_path, monkeypatch):
    # Before: matplotlib's savefig raised FileNotFoundError, a traceback after the whole bench.
    from attngen.eval.bench import chart
    monkeypatch.setattr(chart, "plot_image", lambda report, fmt="png", call="": b"\x89PNG")
    with pytest.raises(WriteError, match="No such file or directory"):
        chart.plot(_bench_report(), tmp_path / "no" / "bench.png")


def test_bench_plot_draws_with_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    from attngen.eval.bench import chart
    chart.plot(_bench_report(), tmp_path / "bench.png")
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_plot_without_matplotlib_is_refused_before_the_run(monkeypatch, tmp_path):
    # Before: ImportError, a traceback after the whole bench had run.
    monkeypatch.setitem(sys.modules, "matplotlib", None)          # import matplotlib raises ImportError
    monkeypatch.setattr("attngen.runtime.gpu_modules", lambda: pytest.fail("reached the GPU"))
    line = assert_clean(*invoke(["bench", _spec(), "--plot", tmp_path / "bench.png"]), exit_code=3)
    assert "matplotlib" in line and "[plot]" in line


def test_bench_plot_of_backward_specs_is_taken_and_checked_before_the_run(monkeypatch, tmp_path):
    # Before: "--plot applies to forward specs", so the backward grid had no chart.
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setattr("attngen.runtime.gpu_modules", lambda: pytest.fail("reached the GPU"))
    spec = str(Path(__file__).resolve().parent.parent / "specs" / "h100_bwd_d64_wgmma_bf16.yaml")
    line = assert_clean(*invoke(["bench", spec, "--plot", tmp_path / "bwd.png"]), exit_code=3)
    assert "matplotlib" in line and "[plot]" in line


def test_backward_report_is_plotted_as_the_backward_call(tmp_path, monkeypatch):
    from attngen.eval import bench
    from attngen.eval.bench import backward as backward_bench, chart
    from attngen.eval.conventions import BenchOptions
    seen = []
    monkeypatch.setattr(backward_bench, "pyplot", lambda: None)
    monkeypatch.setattr(chart, "plot_image", lambda report, fmt="png", call="": seen.append(
        (call, [r.case.flops for r in report.results])) or b"\x89PNG")
    monkeypatch.setattr("attngen.runtime.gpu_modules", lambda: None)
    case = backward_bench.BackwardCase(4, 16, 2048, 64, "fp16", False)
    report = bench.BenchReport("Stub GPU", {"torch": "stub", "cuda": "0", "driver": "0"}, [bench.CaseResult(case, [bench.Timing("h100_bwd_d64_wgmma", 400.0,
                                                                                     case.flops / 400e6, 1.0)])])
    monkeypatch.setattr(backward_bench, "run_backward_bench", lambda *a, **k: {**report.as_dict(), "call": "backward",
                                                                               "notes": []})
    path = tmp_path / "bwd.png"
    run = backward_bench.bench_specs([], [], BenchOptions(plot_file=str(path)), lambda label, length: _Bar(), None)
    assert run.written == (str(path),) and path.read_bytes() == b"\x89PNG"
    assert seen == [("backward", [case.flops])]   # the backward FLOPs (2.5x the forward's) survive the round trip


class _Bar:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n):
        pass


def test_atomic_write_keeps_permissions_and_replaces(tmp_path):
    f = tmp_path / "x"
    f.write_text("old")
    f.chmod(0o640)
    fsutil.atomic_write_text(f, "new")
    assert f.read_text() == "new" and stat.S_IMODE(f.stat().st_mode) == 0o640


def test_atomic_write_new_file_gets_the_umask_mode(tmp_path):
    # mkstemp creates 0600 files; a generated file must be readable like any other.
    f = tmp_path / "new"
    fsutil.atomic_write_bytes(f, b"x")
    assert stat.S_IMODE(f.stat().st_mode) == 0o666 & ~fsutil._UMASK


# -- the cubin cache --------------------------------------------------------------------------------

# A cubin is served only when it carries its source's kernels: the stand-in nvcc builds one for each
# source (test_hostile_cache.fake_build); FAKE_SOURCE defines attngen_t_none.
from test_hostile_cache import FAKE_SOURCE, fake_build  # noqa: E402

FAKE_CUBIN, FAKE_LOG = fake_build(FAKE_SOURCE)
PHASE4_CUBIN, PHASE4_LOG = fake_build((ROOT / "generated" / "phase4.cu").read_text())


class FakeNvcc:
    """Stands in for compile.run_nvcc: counts compiles, optionally slowly."""

    def __init__(self, delay: float = 0.0):
        self.calls = 0
        self.delay = delay
        self.lock = threading.Lock()

    def __call__(self, source, arch, nvcc):
        with self.lock:
            self.calls += 1
        time.sleep(self.delay)
        cubin, log = fake_build(source)
        return CompileResult(arch, cubin, parse_ptxas(log), log, False)


@pytest.fixture
def fake_nvcc(monkeypatch, tmp_path):
    return use_fake_nvcc(monkeypatch, tmp_path, FakeNvcc())


def _entry(source=FAKE_SOURCE, arch="sm_89") -> Path:
    return compile_mod.cache_dir() / compile_mod.cache_key(source, arch, "nvcc")


def _compile(source=FAKE_SOURCE, warnings=None):
    return compile_mod.compile_source(source, "sm_89", on_warning=(warnings.append if warnings is not None
                                                                   else lambda m: None))


def test_cache_hit_is_verified(fake_nvcc):
    first = _compile()
    again = _compile()
    assert (first.cached, again.cached, fake_nvcc.calls) == (False, True, 1)
    assert again.cubin == FAKE_CUBIN and again.functions == first.functions
    manifest = json.loads((_entry() / "manifest.json").read_text())
    assert manifest["cubin_bytes"] == len(FAKE_CUBIN) and manifest["functions"] == 1


def _truncate(entry):
    (entry / "kernel.cubin").write_bytes(FAKE_CUBIN[:100])


def _randomize(entry):
    (entry / "kernel.cubin").write_bytes(os.urandom(len(FAKE_CUBIN)))


def _empty_log(entry):
    (entry / "ptxas.log").write_bytes(b"")


def _corrupt_log(entry):
    (entry / "ptxas.log").write_bytes(b"\xff\xfe\x00garbage" * 10)


def _corrupt_log_matching_manifest(entry):
    # Even a manifest that matches the damage does not make a non-UTF-8 log usable.
    data = b"\xff\xfe\x00garbage" * 10
    (entry / "ptxas.log").write_bytes(data)
    m = json.loads((entry / "manifest.json").read_text())
    m.update(log_bytes=len(data), log_sha256=compile_mod._sha256(data))
    (entry / "manifest.json").write_text(json.dumps(m))


def _empty_log_matching_manifest(entry):
    (entry / "ptxas.log").write_bytes(b"")
    m = json.loads((entry / "manifest.json").read_text())
    m.update(log_bytes=0, log_sha256=compile_mod._sha256(b""))
    (entry / "manifest.json").write_text(json.dumps(m))


def _no_manifest(entry):
    (entry / "manifest.json").unlink()


def _garbage_manifest(entry):
    (entry / "manifest.json").write_bytes(b"{not json")


def _missing_cubin(entry):
    (entry / "kernel.cubin").unlink()


def _entry_is_a_file(entry):
    # Before: ensure_dir met a file in the way, exit 3 instead of a rebuild.
    shutil.rmtree(entry)
    entry.write_bytes(FAKE_CUBIN)


def _entry_is_a_dangling_link(entry):
    shutil.rmtree(entry)
    entry.symlink_to(entry.parent / "nowhere")


DAMAGE = {"truncated_cubin": _truncate, "random_cubin": _randomize, "empty_log": _empty_log,
          "corrupt_log": _corrupt_log, "corrupt_log_matching_manifest": _corrupt_log_matching_manifest,
          "empty_log_matching_manifest": _empty_log_matching_manifest, "no_manifest": _no_manifest,
          "garbage_manifest": _garbage_manifest, "missing_cubin": _missing_cubin,
          "entry_is_a_file": _entry_is_a_file, "entry_is_a_dangling_link": _entry_is_a_dangling_link}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_cache_entry_is_reported_and_rebuilt(fake_nvcc, damage):
    _compile()
    DAMAGE[damage](_entry())
    warnings = []
    res = _compile(warnings=warnings)
    assert not res.cached and fake_nvcc.calls == 2               # rebuilt, not used
    assert res.cubin == FAKE_CUBIN and len(res.functions) == 1
    assert len(warnings) == 1 and "damaged cache entry" in warnings[0] and "rebuilding" in warnings[0]
    again = _compile()                                           # the rebuilt entry is good
    assert again.cached and again.cubin == FAKE_CUBIN and fake_nvcc.calls == 2


def test_damaged_entry_through_the_cli(fake_nvcc, tmp_path):
    # Before: exit 0 with an empty resource table (empty log) and the broken cubin copied to --out.
    spec = _spec()
    code, out, err, exc, _ = invoke(["compile", spec, "--out", tmp_path / "out"])
    assert code == 0, err
    (entry,) = [d for d in (tmp_path / "cache").iterdir()]
    _truncate(entry)
    _empty_log(entry)
    code, out, err, exc, _ = invoke(["compile", spec, "--out", tmp_path / "out"])
    assert code == 0 and "Traceback" not in err
    assert "attngen: damaged cache entry" in err and "rebuilding it" in err
    assert "attngen_phase4_none" in out                           # a real resource table
    assert (tmp_path / "out" / "phase4.sm_89.cubin").read_bytes() == PHASE4_CUBIN


def test_entry_that_is_a_file_through_the_cli(fake_nvcc, tmp_path):
    code, out, err, exc, _ = invoke(["compile", _spec()])
    assert code == 0, err
    (entry,) = [d for d in (tmp_path / "cache").iterdir()]
    _entry_is_a_file(entry)
    code, out, err, exc, _ = invoke(["compile", _spec()])
    assert code == 0 and "Traceback" not in err, err
    assert "attngen: damaged cache entry" in err and "is a file" in err and "rebuilding it" in err
    assert entry.is_dir() and fake_nvcc.calls == 2


def test_explain_arch_with_an_empty_log_is_rebuilt(fake_nvcc):
    # Before: an empty cached ptxas.log made `explain --arch` raise ValueError from max().
    code, out, err, exc, _ = invoke(["explain", _spec(), "--arch", "sm_89"])
    assert code == 0, err
    (entry,) = [d for d in compile_mod.cache_dir().iterdir()]
    _empty_log_matching_manifest(entry)
    code, out, err, exc, _ = invoke(["explain", _spec(), "--arch", "sm_89"])
    assert code == 0 and "by registers (96/thread)" in out and "damaged cache entry" in err


def test_ptxas_reporting_no_function_is_a_tool_error(monkeypatch, fake_nvcc):
    fake_nvcc_empty = lambda source, arch, nvcc: CompileResult(arch, FAKE_CUBIN, (), "", False)  # noqa: E731
    monkeypatch.setattr(compile_mod, "run_nvcc", fake_nvcc_empty)
    line = assert_clean(*invoke(["explain", _spec(), "--arch", "sm_89"]), exit_code=3)
    assert "no kernel function" in line


def test_cache_write_failure_is_an_error(fake_nvcc, monkeypatch):
    # Before: a full disk left a cubin and a 0-byte log, exit 0, and the next run used them.
    write_all = fsutil._write_all
    monkeypatch.setattr(fsutil, "_write_all", _enospc_after_half)
    line = assert_clean(*invoke(["compile", _spec()]), exit_code=3)
    assert "No space left on device" in line and "ATTNGEN_CACHE_DIR" in line
    (entry,) = compile_mod.cache_dir().iterdir()
    assert sorted(p.name for p in entry.iterdir()) == [".lock"]   # no partial file under a real name
    monkeypatch.setattr(fsutil, "_write_all", write_all)
    code, out, err, exc, _ = invoke(["compile", _spec()])
    assert code == 0 and fake_nvcc.calls == 2 and "attngen_phase4_none" in out


def test_cache_dir_that_cannot_be_created(fake_nvcc, monkeypatch, tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(blocker / "cache"))
    line = assert_clean(*invoke(["compile", _spec()]), exit_code=3)
    assert "cannot create directory" in line and "ATTNGEN_CACHE_DIR" in line


def _read_only_below(monkeypatch, root: Path) -> None:
    """Make every file or directory creation under `root` fail as on a read-only filesystem
    (EROFS, which root cannot bypass as it can a mode bit); reads and everything else go on."""
    real_open, real_mkdir = os.open, os.mkdir
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT

    def below(path) -> bool:
        return os.path.abspath(os.fspath(path)).startswith(str(root))

    def ro_open(path, flags, *a, **kw):
        if flags & writes and below(path):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))
        return real_open(path, flags, *a, **kw)

    def ro_mkdir(path, *a, **kw):
        if below(path):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))
        return real_mkdir(path, *a, **kw)
    monkeypatch.setattr(os, "open", ro_open)
    monkeypatch.setattr(os, "mkdir", ro_mkdir)


def test_read_only_cache_still_serves_hits(fake_nvcc, monkeypatch, tmp_path):
    # Before, this stood a raw OSError in for the lock and accepted any exception; what a read-only
    # cache really gives is a hit served without writing and a miss that is one WriteError line.
    _compile()
    invoke(["compile", _spec()])                                 # the spec's entry too
    _read_only_below(monkeypatch, tmp_path / "cache")
    assert _compile().cached                                     # reading needs no write
    with pytest.raises(WriteError) as info:
        _compile("another source")
    assert "Read-only file system" in str(info.value) and "ATTNGEN_CACHE_DIR" in str(info.value)
    code, out, err, exc, _ = invoke(["compile", _spec()])        # a hit through the CLI
    assert code == 0 and "attngen_phase4_none" in out, err
    other = write_spec(tmp_path, "other", SCALAR)                # a miss through the CLI
    line = assert_clean(*invoke(["compile", other]), exit_code=3)
    assert line.startswith("attngen: cannot ") and "Read-only file system" in line and "ATTNGEN_CACHE_DIR" in line


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.EOPNOTSUPP], ids=["ENOLCK", "EOPNOTSUPP"])
def test_cache_on_a_filesystem_without_locks(fake_nvcc, monkeypatch, code):
    # NFS without a lock daemon and some FUSE filesystems refuse flock; before, the OSError escaped
    # compile_source as a traceback. The cache is used unlocked: its writes are atomic anyway.
    fcntl = pytest.importorskip("fcntl")

    def no_locks(fd, operation):
        raise OSError(code, os.strerror(code))
    monkeypatch.setattr(fcntl, "flock", no_locks)
    first, again = _compile(), _compile()
    assert (first.cached, again.cached, fake_nvcc.calls) == (False, True, 1)
    code_, out, err, exc, _ = invoke(["compile", _spec()])
    assert code_ == 0 and "Traceback" not in err and "attngen_phase4_none" in out, err


def test_lock_passes_errors_of_its_block_through(tmp_path):
    with pytest.raises(OSError, match="from the block"):
        with fsutil.locked(tmp_path / ".lock"):
            raise OSError(errno.ENOLCK, "from the block")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_cache_dir(fake_nvcc, tmp_path):
    _compile()
    cache = tmp_path / "cache"
    for d in [cache, *cache.iterdir()]:
        d.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        assert _compile().cached
        line = assert_clean(*invoke(["compile", _spec()]), exit_code=3)
        assert "Permission denied" in line
    finally:
        for d in [cache, *cache.iterdir()]:
            d.chmod(stat.S_IRWXU)


def test_concurrent_compiles_share_one_nvcc_run(fake_nvcc):
    fake_nvcc.delay = 0.3
    results = []
    threads = [threading.Thread(target=lambda: results.append(_compile())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fake_nvcc.calls == 1
    assert len(results) == 4 and sum(not r.cached for r in results) == 1
    assert all(r.cubin == FAKE_CUBIN for r in results)


FAKE_NVCC_SCRIPT = """\
#!{python}
# A stand-in for nvcc: answers --version and --dryrun, and "compiles" by writing a fixed cubin
# after a pause, recording each compile in $FAKE_NVCC_LOG.
import os, sys, time
args = sys.argv[1:]
if "--version" in args:
    print("Cuda compilation tools, release 0.0, V0.0.1")
    sys.exit(0)
if "--dryrun" in args:
    sys.exit(0)
with open(os.environ["FAKE_NVCC_LOG"], "a") as f:
    f.write("compile\\n")
time.sleep(0.5)
out = args[args.index("-o") + 1]
with open(out, "wb") as f:
    f.write({cubin!r})
sys.stderr.write({log!r})
"""


def test_concurrent_processes_share_one_nvcc_run(tmp_path):
    # Before: 4 processes compiling one spec all ran nvcc and raced on the cache files.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    nvcc = bindir / "nvcc"
    nvcc.write_text(FAKE_NVCC_SCRIPT.format(python=sys.executable, cubin=PHASE4_CUBIN, log=PHASE4_LOG))
    nvcc.chmod(0o755)
    calls = tmp_path / "calls"
    env = {**_cli_env(), "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
           "ATTNGEN_CACHE_DIR": str(tmp_path / "cache"), "FAKE_NVCC_LOG": str(calls)}
    procs = [subprocess.Popen([sys.executable, "-m", "attngen", "compile", _spec(), "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
             for _ in range(4)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outs
    assert calls.read_text().count("compile") == 1, outs
    reports = [json.loads(out) for out, _ in outs]
    assert all(r == reports[0] and r[0]["registers"] == 96 for r in reports)


def test_an_entry_another_thread_just_made_is_not_damage(tmp_path, monkeypatch):
    """A cache entry directory created by another thread while this one looks at the path is the
    entry, not a damaged file: no warning, no removal, no WriteError (test_concurrent_compiles_...
    met this race once in CI)."""
    entry = tmp_path / "entry"
    real = os.path.lexists

    def made_meanwhile(path):
        entry.mkdir(exist_ok=True)              # the other thread's ensure_dir, between the checks
        return real(path)

    monkeypatch.setattr(os.path, "lexists", made_meanwhile)
    warnings = []
    compile_mod.clear_non_directory_entry(entry, warnings.append)
    assert entry.is_dir() and warnings == []


def test_a_bundle_is_written_whole_or_not_at_all(tmp_path):
    """A decode spec renders two files; when the second cannot be written, the first is put back as
    it was (absent, or its old text) and the build exits 3."""
    out = tmp_path / "gen"
    out.mkdir()
    (out / "h200_decode_d128_combine.cu").mkdir()          # a folder where the file goes: its rename fails
    code, stdout, stderr, *_ = invoke(["build", _spec("specs/h200_decode_d128.yaml"), "--out", out])
    assert code == 3, (stdout, stderr)
    assert not (out / "h200_decode_d128_split.cu").exists()
    (out / "h200_decode_d128_split.cu").write_text("old text\n")
    code, *_ = invoke(["build", _spec("specs/h200_decode_d128.yaml"), "--out", out])
    assert code == 3 and (out / "h200_decode_d128_split.cu").read_text() == "old text\n"
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]


# -- the project from anywhere inside it ------------------------------------------------------------

def _run(args, cwd):
    return subprocess.run([sys.executable, "-m", "attngen", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=_cli_env(), timeout=120)


def test_commands_find_the_project_from_inside_it(tmp_path):
    root = mini_project(tmp_path, "tests")
    run = _run(["check"], root / "generated")                       # used to fail: "no spec files"
    assert run.returncode == 0 and "1 generated file(s) in sync" in run.stdout, run.stdout + run.stderr
    run = _run(["build", "../specs/phase4.yaml"], root / "tests")    # used to write tests/generated/
    assert run.returncode == 0 and "unchanged ../generated/phase4.cu" in run.stdout, run.stdout + run.stderr
    assert not (root / "tests" / "generated").exists()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = _run(["--root", root, "check"], elsewhere)
    assert run.returncode == 0, run.stdout + run.stderr
    run = _run(["check"], elsewhere)
    assert run.returncode == 2 and "pass --root PROJECT" in run.stderr, run.stderr


def test_empty_out_is_refused(tmp_path):
    run = _run(["build", "--out", "", ROOT / "specs" / "phase4.yaml"], tmp_path)
    assert run.returncode == 2 and "'--out': is empty" in run.stderr, run.stderr
    assert not list(tmp_path.iterdir())
