#!/usr/bin/env python3
"""Extract the uncompressed kernel (an ELF vmlinux) from a bzImage, for
QEMU's PVH boot of the interop guest (scripts/guest/run.sh).

Under TCG, booting the bzImage spends most of its time before the kernel
starts: the real-mode stub decompresses the 8 MiB XZ payload in emulated
code (42 s of a 75 s boot, measured on the CI's kind of machine, loaded).
QEMU can instead load an ELF vmlinux that carries the Xen PVH entry note
(XEN_ELFNOTE_PHYS32_ENTRY; the kernel has it with CONFIG_PVH) and enter it
directly: the same boot then took 21 s. The decompression happens once,
here, natively (a few seconds).

    extract-vmlinux.py BZIMAGE OUT

Exit status: 0 with OUT written; 3 when the image has no PVH entry (boot
the bzImage then); 1 on a malformed image or an unknown compression.
The payload is located through the boot protocol's setup header
(Documentation/arch/x86/boot.rst: `setup_sects` at 0x1f1, magic `HdrS` at
0x202, version at 0x206, `payload_offset`/`payload_length` at 0x248/0x24c,
protocol 2.08 and later).
"""

import gzip
import lzma
import os
import shutil
import struct
import subprocess
import sys

PT_NOTE = 4
XEN_ELFNOTE_PHYS32_ENTRY = 18


def payload(image: bytes) -> bytes:
    if len(image) < 0x250 or image[0x202:0x206] != b"HdrS":
        raise ValueError("not a bzImage (no HdrS setup header)")
    (version,) = struct.unpack_from("<H", image, 0x206)
    if version < 0x208:
        raise ValueError(f"boot protocol {version >> 8}.{version & 0xFF} has no payload fields")
    setup_sects = image[0x1F1] or 4
    offset, length = struct.unpack_from("<II", image, 0x248)
    start = (setup_sects + 1) * 512 + offset
    if start + length > len(image):
        raise ValueError("payload runs past the end of the image")
    return image[start : start + length]


def decompress(data: bytes) -> bytes:
    if data.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data)
    if data.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=__import__("io").BytesIO(data)).read()
    if data.startswith(b"\x28\xb5\x2f\xfd"):
        if not shutil.which("zstd"):
            raise ValueError("zstd payload and no zstd command (apt-get install zstd)")
        return subprocess.run(["zstd", "-dc"], input=data, capture_output=True, check=True).stdout
    if data.startswith(b"\x5d\x00\x00"):
        return lzma.LZMADecompressor(format=lzma.FORMAT_ALONE).decompress(data)
    raise ValueError(f"unknown payload compression (magic {data[:4].hex()})")


def has_pvh_entry(elf: bytes) -> bool:
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise ValueError("the payload is not a 64-bit ELF")
    (phoff,) = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    for i in range(phnum):
        p_type, _flags, p_offset, _va, _pa, p_filesz = struct.unpack_from(
            "<IIQQQQ", elf, phoff + i * phentsize
        )
        if p_type != PT_NOTE:
            continue
        pos, end = p_offset, p_offset + p_filesz
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", elf, pos)
            name = elf[pos + 12 : pos + 12 + namesz].rstrip(b"\0")
            if name == b"Xen" and ntype == XEN_ELFNOTE_PHYS32_ENTRY:
                return True
            pos += 12 + (namesz + 3) // 4 * 4 + (descsz + 3) // 4 * 4
    return False


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) == 2 else 2
    src, out = sys.argv[1], sys.argv[2]
    try:
        with open(src, "rb") as f:
            elf = decompress(payload(f.read()))
        if not has_pvh_entry(elf):
            print(f"extract-vmlinux: {src} has no PVH entry note (CONFIG_PVH off)", file=sys.stderr)
            return 3
    except (ValueError, lzma.LZMAError, OSError, subprocess.CalledProcessError) as e:
        print(f"extract-vmlinux: {src}: {e}", file=sys.stderr)
        return 1
    tmp = f"{out}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(elf)
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
