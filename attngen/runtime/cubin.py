"""Facts read from a cubin (an ELF file): where each kernel's parameters start in its parameter
buffer. A by-value parameter aligned above the constant bank's own alignment (a struct holding
64-byte aligned TMA tensor maps) is placed past a gap (48 bytes on sm_90), and a launch that
passes the parameters as one buffer must start them there."""
from __future__ import annotations

import struct

KPARAM_INFO = 0x17          # EIATTR_KPARAM_INFO: one record per kernel parameter
PARAM_CBANK = 0x0A          # EIATTR_PARAM_CBANK: where the parameter buffer sits, and its size
SVAL = 4                    # .nv.info record format with a 16-bit size and that many bytes
FIXED = (1, 2, 3)           # formats with a 2-byte value (NVAL, BVAL, HVAL): every record is 4 bytes
SHT_NOBITS = 8              # a section with a size and no bytes in the file (.nv.shared.*)


def sections(elf: bytes) -> dict[str, bytes]:
    """{name: contents} of every section of a 64-bit ELF cubin; a NOBITS section reads as that many
    zero bytes (what it holds at load)."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise ValueError("not a 64-bit ELF cubin")
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]

    def name(offset: int) -> str:
        end = elf.index(b"\0", names_at + offset)
        return elf[names_at + offset:end].decode()

    return {name(h[0]): bytes(h[5]) if h[1] == SHT_NOBITS else elf[h[4]:h[4] + h[5]] for h in headers}


def _records(info: bytes):
    """(attribute, payload) of every record of an .nv.info section."""
    at = 0
    while at + 4 <= len(info):
        fmt, attr = info[at], info[at + 1]
        if fmt == SVAL:
            size = struct.unpack_from("<H", info, at + 2)[0]
            yield attr, info[at + 4:at + 4 + size]
            at += 4 + size
        elif fmt in FIXED:
            yield attr, info[at + 2:at + 4]
            at += 4
        else:
            raise ValueError(f"unknown .nv.info record format {fmt} at byte {at}")


def param_layout(cubin: bytes) -> dict[str, tuple[int, int]]:
    """kernel name -> (byte offset of its first parameter, size of its parameter buffer)."""
    out = {}
    for section, data in sections(cubin).items():
        if not section.startswith(".nv.info."):
            continue
        records = list(_records(data))
        offsets = [struct.unpack_from("<IHH", payload)[2] for attr, payload in records
                   if attr == KPARAM_INFO and len(payload) >= 8]
        sizes = [struct.unpack_from("<IHH", payload)[2] for attr, payload in records
                 if attr == PARAM_CBANK and len(payload) >= 8]
        if offsets:
            out[section[len(".nv.info."):]] = (min(offsets), sizes[0] if sizes else -1)
    return out


def param_offsets(cubin: bytes) -> dict[str, int]:
    """kernel name -> byte offset of its first parameter in the parameter buffer."""
    return {name: offset for name, (offset, _size) in param_layout(cubin).items()}
