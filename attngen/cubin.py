"""Facts read from a cubin (an ELF file): where each kernel's parameters start in its parameter
buffer. A by-value parameter aligned above the constant bank's own alignment (a struct holding
64-byte aligned TMA tensor maps) is placed past a gap (48 bytes on sm_90), and a launch that
passes the parameters as one buffer must start them there."""
from __future__ import annotations

import struct

KPARAM_INFO = 0x17          # EIATTR_KPARAM_INFO: one record per kernel parameter
SVAL, HVAL, BVAL = 4, 3, 2  # .nv.info record formats: sized value, 16-bit value, 8-bit value


def _sections(elf: bytes) -> dict[str, bytes]:
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise ValueError("not a 64-bit ELF cubin")
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]

    def name(offset: int) -> str:
        end = elf.index(b"\0", names_at + offset)
        return elf[names_at + offset:end].decode()

    return {name(h[0]): elf[h[4]:h[4] + h[5]] for h in headers}


def _records(info: bytes):
    """(attribute, payload) of every record of an .nv.info section."""
    at = 0
    while at + 2 <= len(info):
        fmt, attr = info[at], info[at + 1]
        at += 2
        if fmt == SVAL:
            size = struct.unpack_from("<H", info, at)[0]
            yield attr, info[at + 2:at + 2 + size]
            at += 2 + size
        elif fmt == HVAL:
            yield attr, info[at:at + 2]
            at += 2
        elif fmt == BVAL:
            yield attr, info[at:at + 1]
            at += 1
        else:
            yield attr, b""


def param_offsets(cubin: bytes) -> dict[str, int]:
    """kernel name -> byte offset of its first parameter in the parameter buffer."""
    out = {}
    for section, data in _sections(cubin).items():
        if not section.startswith(".nv.info."):
            continue
        offsets = [struct.unpack_from("<IHH", payload)[2] for attr, payload in _records(data)
                   if attr == KPARAM_INFO and len(payload) >= 8]
        if offsets:
            out[section[len(".nv.info."):]] = min(offsets)
    return out
