"""A damaged copy of a zip-format file (a torch checkpoint or snapshot, an .npz pack): bytes inverted inside its
largest member's stored data, the headers and the central directory left whole, as a bad disk or a broken copy leaves
them. torch.load reads such a checkpoint without complaint."""

import struct
import zipfile


def flip_bytes(src, dst, count: int = 200):
    with zipfile.ZipFile(src) as archive:
        member = max(archive.infolist(), key=lambda info: info.compress_size)
    data = bytearray(open(src, "rb").read())
    name_length, extra_length = struct.unpack("<HH", data[member.header_offset + 26 : member.header_offset + 30])
    start = member.header_offset + 30 + name_length + extra_length  # the member's data, after its local header
    middle = start + (member.compress_size - count) // 2
    for i in range(middle, middle + count):
        data[i] ^= 0xFF
    with open(dst, "wb") as f:
        f.write(data)
    return str(dst)
