"""Protobuf wire format around tensor bytes, so that large tensors are not copied by Python.

The protobuf runtime's `bytes` fields take and give `bytes` objects: a request built with
`Tensor(data=array.tobytes())` copies the array once into `bytes`, once into the message
and once more when serialized; a response's `tensor.data` is a copy of the parsed copy of
the received message. Instead, a request here is serialized by protobuf without its tensor
data, and the data follows as extra occurrences of the same message fields (the wire format
merges repeated occurrences of a message field into one message), all joined into the one
`bytes` object gRPC sends: one copy of each array. A response is scanned for its tensors'
`data` fields, which become numpy arrays over the received `bytes` (no copy); the rest, with
the data cut out, is parsed by protobuf.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple, Union

# Wire types.
VARINT = 0
I64 = 1
LEN = 2
I32 = 5

# Tensor.data's field number (compute.proto).
TENSOR_DATA_FIELD = 3

Piece = Union[bytes, memoryview]


def varint(value: int) -> bytes:
    """The base-128 varint of a non-negative integer."""
    if value < 0:
        raise ValueError("varint of a negative number")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def key(field: int, wire_type: int) -> bytes:
    """The key (field number and wire type) that precedes a field."""
    return varint((field << 3) | wire_type)


class Pieces:
    """A message being built as a list of byte pieces (bytes or memoryviews) and its size."""

    __slots__ = ("parts", "size")

    def __init__(self, first: Piece = b"") -> None:
        self.parts: List[Piece] = []
        self.size = 0
        if first:
            self.add(first)

    def add(self, piece: Piece) -> None:
        self.parts.append(piece)
        self.size += len(piece) if isinstance(piece, bytes) else piece.nbytes

    def add_field(self, field: int, body: "Pieces") -> None:
        """Appends `body` as the length-delimited field `field`."""
        self.add(key(field, LEN) + varint(body.size))
        self.parts.extend(body.parts)
        self.size += body.size

    def join(self) -> bytes:
        """The message as one bytes object (one copy of every piece)."""
        if len(self.parts) == 1 and isinstance(self.parts[0], bytes):
            return self.parts[0]
        return b"".join(self.parts)


def tensor_data_field(field: int, data: memoryview) -> Pieces:
    """A message field `field` holding a Tensor that carries only `data` (to be merged into the
    Tensor serialized beside it with dtype and shape)."""
    inner = Pieces(key(TENSOR_DATA_FIELD, LEN) + varint(data.nbytes))
    inner.add(data)
    out = Pieces()
    out.add_field(field, inner)
    return out


def read_varint(buf: memoryview, pos: int, end: int) -> Tuple[int, int]:
    """Reads a varint at `pos`; returns (value, position after it)."""
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _field_end(buf: memoryview, pos: int, end: int, wire_type: int) -> Tuple[int, int]:
    """For a field whose key ended at `pos`: (start of its payload, end of the field)."""
    if wire_type == VARINT:
        _, after = read_varint(buf, pos, end)
        return pos, after
    if wire_type == I64:
        return pos, pos + 8
    if wire_type == I32:
        return pos, pos + 4
    if wire_type == LEN:
        length, start = read_varint(buf, pos, end)
        return start, start + length
    raise ValueError(f"unsupported wire type {wire_type}")


# What to cut out of a message: field number -> TENSOR (a Tensor message whose data is cut
# out), DATA (this bytes field itself) or a nested spec (a message to scan in turn).
TENSOR = "tensor"
DATA = "data"
Spec = Dict[int, Union[str, "Spec"]]
Path = Tuple[int, ...]


def _strip(buf: memoryview, start: int, end: int, spec: Spec, path: Path,
           out: List[Piece], datas: Dict[Path, memoryview]) -> None:
    pos = start
    copy_from = start  # bytes [copy_from, pos) are kept as they are
    while pos < end:
        field_start = pos
        k, pos = read_varint(buf, pos, end)
        field, wire_type = k >> 3, k & 7
        payload, after = _field_end(buf, pos, end, wire_type)
        if after > end:
            raise ValueError("truncated field")
        what = spec.get(field) if wire_type == LEN else None
        if what is not None:
            out.append(buf[copy_from:field_start])
            if what == DATA:
                datas[path + (field,)] = buf[payload:after]
            else:
                inner: List[Piece] = []
                sub: Spec = {TENSOR_DATA_FIELD: DATA} if what == TENSOR else what  # type: ignore
                _strip(buf, payload, after, sub, path + (field,), inner, datas)
                size = sum(p.nbytes if isinstance(p, memoryview) else len(p) for p in inner)
                out.append(key(field, LEN) + varint(size))
                out.extend(inner)
            copy_from = after
        pos = after
    out.append(buf[copy_from:end])


def strip(message: bytes, spec: Spec) -> Tuple[bytes, Dict[Path, memoryview]]:
    """Cuts the fields named by `spec` out of `message`. Returns the rest (to parse with
    protobuf) and the cut fields' payloads by path (field numbers from the top), as views of
    `message`. ValueError for a malformed message."""
    buf = memoryview(message)
    pieces: List[Piece] = []
    datas: Dict[Path, memoryview] = {}
    _strip(buf, 0, len(buf), spec, (), pieces, datas)
    return b"".join(pieces), datas


def find_fields(message: bytes, fields: Sequence[int]) -> Dict[int, Union[int, memoryview]]:
    """The last value of each of the top-level `fields` (varints as int, length-delimited as a
    view): for the small messages read without protobuf (grpc.health.v1)."""
    buf = memoryview(message)
    pos, end = 0, len(buf)
    found: Dict[int, Union[int, memoryview]] = {}
    while pos < end:
        k, pos = read_varint(buf, pos, end)
        field, wire_type = k >> 3, k & 7
        payload, after = _field_end(buf, pos, end, wire_type)
        if field in fields:
            if wire_type == VARINT:
                found[field] = read_varint(buf, payload, end)[0]
            elif wire_type == LEN:
                found[field] = buf[payload:after]
        pos = after
    return found
