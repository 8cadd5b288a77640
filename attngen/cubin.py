"""Facts read from a cubin (an ELF file): its kernels, where each kernel's parameters start in its
parameter buffer, and the resources ptxas gave each kernel. A by-value parameter aligned above the
constant bank's own alignment (a struct holding 64-byte aligned TMA tensor maps) is placed past a
gap (48 bytes on sm_90), and a launch that passes the parameters as one buffer must start them
there.

Every reader raises ValueError on a file that is not a well-formed cubin (truncated, an offset
past its end, a record out of step), never another exception: a cache entry's cubin is input."""
from __future__ import annotations

import struct
from typing import NamedTuple

KPARAM_INFO = 0x17          # EIATTR_KPARAM_INFO: one record per kernel parameter
PARAM_CBANK = 0x0A          # EIATTR_PARAM_CBANK: where the parameter buffer sits, and its size
FRAME_SIZE = 0x11           # EIATTR_FRAME_SIZE: (symbol, bytes of stack frame), in .nv.info
REGCOUNT = 0x2F             # EIATTR_REGCOUNT: (symbol, registers per thread), in .nv.info
NUM_BARRIERS = 0x4C         # EIATTR_NUM_BARRIERS: named barriers a kernel uses
SVAL = 4                    # .nv.info record format with a 16-bit size and that many bytes
FIXED = (1, 2, 3)           # formats with a 2-byte value (NVAL, BVAL, HVAL): every record is 4 bytes
SHT_NOBITS = 8              # a section with a size and no bytes in the file (.nv.shared.*)
NOBITS_MAX = 1 << 24        # far above any GPU's shared memory: a larger NOBITS size is not a cubin's
SYMBOL_MASK = 0xFFFFFF      # .text.<kernel>'s sh_info: its symbol; older cubins keep registers above
# sm_90 and later reserve shared memory for the system at the start of every block's window; the
# cubin marks it with a .nv.shared.reserved.0 section and counts it in each .nv.shared.<kernel>,
# while ptxas (and the launch's byte count) report the kernel's own static shared memory.
RESERVED_SMEM_SECTION = ".nv.shared.reserved.0"
RESERVED_SMEM_BYTES = 1024


class Section(NamedTuple):
    # A NamedTuple, not a frozen dataclass: a first call defines this class (core.frozen says why).
    name: str
    type: int
    flags: int
    info: int
    data: bytes


def _headers(elf: bytes) -> list[Section]:
    if elf[:4] != b"\x7fELF" or len(elf) < 0x40 or elf[4] != 2:
        raise ValueError("not a 64-bit ELF cubin")
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    if shentsize < 0x40 or shoff + shnum * shentsize > len(elf) or shstrndx >= shnum:
        raise ValueError("the cubin's section headers lie outside it")
    headers = [struct.unpack_from("<IIQQQQII", elf, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]

    def name(offset: int) -> str:
        end = elf.find(b"\0", names_at + offset)
        if names_at + offset >= len(elf) or end < 0:
            raise ValueError("a section name lies outside the cubin")
        return elf[names_at + offset:end].decode("ascii")

    out = []
    for h in headers:
        if h[1] != SHT_NOBITS and h[4] + h[5] > len(elf):
            raise ValueError("a section lies outside the cubin")
        if h[1] == SHT_NOBITS and h[5] > NOBITS_MAX:
            raise ValueError(f"a NOBITS section of {h[5]} bytes")
        out.append(Section(name(h[0]), h[1], h[2], h[7], bytes(h[5]) if h[1] == SHT_NOBITS else elf[h[4]:h[4] + h[5]]))
    return out


def _section_headers(elf: bytes) -> list[Section]:
    """Every section of a 64-bit ELF cubin, in order; ValueError for anything malformed."""
    try:
        return _headers(elf)
    except (struct.error, IndexError, UnicodeDecodeError, MemoryError, OverflowError) as exc:
        raise ValueError(f"not a well-formed cubin ({type(exc).__name__})") from None


def sections(elf: bytes) -> dict[str, bytes]:
    """{name: contents} of every section of a 64-bit ELF cubin; a NOBITS section reads as that many
    zero bytes (what it holds at load)."""
    return {s.name: s.data for s in _section_headers(elf)}


def _records(info: bytes):
    """(attribute, payload) of every record of an .nv.info section."""
    at = 0
    while at + 4 <= len(info):
        fmt, attr = info[at], info[at + 1]
        if fmt == SVAL:
            size = struct.unpack_from("<H", info, at + 2)[0]
            if at + 4 + size > len(info):
                raise ValueError(f".nv.info record at byte {at} runs past its section")
            yield attr, info[at + 4:at + 4 + size]
            at += 4 + size
        elif fmt in FIXED:
            yield attr, info[at + 2:at + 4]
            at += 4
        else:
            raise ValueError(f"unknown .nv.info record format {fmt} at byte {at}")


def _kernel_infos(secs: list[Section]) -> dict[str, list[tuple[int, bytes]]]:
    """kernel name -> the records of its .nv.info.<name> section (every kernel has one)."""
    return {s.name[len(".nv.info."):]: list(_records(s.data)) for s in secs if s.name.startswith(".nv.info.")}


def param_layout(cubin: bytes) -> dict[str, tuple[int, int]]:
    """kernel name -> (byte offset of its first parameter, size of its parameter buffer)."""
    out = {}
    for name, records in _kernel_infos(_section_headers(cubin)).items():
        offsets = [struct.unpack_from("<IHH", payload)[2] for attr, payload in records
                   if attr == KPARAM_INFO and len(payload) >= 8]
        sizes = [struct.unpack_from("<IHH", payload)[2] for attr, payload in records
                 if attr == PARAM_CBANK and len(payload) >= 8]
        if offsets:
            out[name] = (min(offsets), sizes[0] if sizes else -1)
    return out


def param_offsets(cubin: bytes) -> dict[str, int]:
    """kernel name -> byte offset of its first parameter in the parameter buffer."""
    return {name: offset for name, (offset, _size) in param_layout(cubin).items()}


class KernelFacts(NamedTuple):
    """What the cubin itself records about one kernel: the resources of ptxas's report (all but the
    spill byte counts, which only ptxas's log gives) and its parameters as (offset, size)."""

    # A NamedTuple, not a frozen dataclass: a first call defines this class (core.frozen says why).
    name: str
    registers: int
    stack_bytes: int
    smem_bytes: int
    barriers: int
    params: tuple[tuple[int, int], ...]


def _param_records(records) -> tuple[tuple[int, int], ...]:
    """(offset, size) of each parameter in ordinal order; the size is the top 14 bits of the
    record's last word."""
    params = []
    for attr, payload in records:
        if attr == KPARAM_INFO and len(payload) >= 12:
            _index, ordinal, offset, word = struct.unpack_from("<IHHI", payload)
            params.append((ordinal, offset, word >> 18))
    return tuple((offset, size) for _ordinal, offset, size in sorted(params))


def _per_symbol(records, attr: int) -> dict[int, int]:
    """{symbol index: value} of the .nv.info records `attr` that name a symbol."""
    return {sym: value for a, payload in records if a == attr and len(payload) >= 8
            for sym, value in [struct.unpack_from("<II", payload)]}


def kernel_facts(cubin: bytes) -> dict[str, KernelFacts]:
    """kernel name -> KernelFacts, read from the cubin's sections; ValueError when malformed."""
    secs = _section_headers(cubin)
    by_name = {s.name: s for s in secs}
    common = list(_records(by_name[".nv.info"].data)) if ".nv.info" in by_name else []
    registers, frames = _per_symbol(common, REGCOUNT), _per_symbol(common, FRAME_SIZE)
    reserved = RESERVED_SMEM_BYTES if RESERVED_SMEM_SECTION in by_name else 0
    out = {}
    for name, records in _kernel_infos(secs).items():
        text = by_name.get(f".text.{name}")
        if text is None:
            raise ValueError(f"kernel {name} has no code section")
        symbol = text.info & SYMBOL_MASK
        smem = len(by_name[f".nv.shared.{name}"].data) if f".nv.shared.{name}" in by_name else 0
        barriers = [int.from_bytes(p[:2], "little") for a, p in records if a == NUM_BARRIERS and len(p) >= 2]
        out[name] = KernelFacts(name, registers.get(symbol, text.info >> 24), frames.get(symbol, 0),
                                max(smem - reserved, 0) if smem else 0, barriers[0] if barriers else 0,
                                _param_records(records))
    return out
