"""Upload and Download messages, built and read around the tensor bytes (see _wire)."""

from __future__ import annotations

from typing import Callable, Iterator, List, Optional, Tuple

import grpc
import numpy as np

from gpucompute import _wire
from gpucompute._channel import new_upload_id
from gpucompute._tensors import Operand, invalid, numpy_dtype
from gpucompute.errors import ComputeError
from gpucompute.v1 import compute_pb2 as pb

# UploadRequest: header 1, offset 2, data 3. DownloadResponse: tensor 1, offset 2, data 3.
_UPLOAD_OFFSET = _wire.key(2, _wire.VARINT)
_UPLOAD_DATA = _wire.key(3, _wire.LEN)
_DOWNLOAD_SPEC: _wire.Spec = {3: _wire.DATA}


def upload_headers(op: Operand, parts: List[Tuple[int, int]],
                   device: Optional[int]) -> List[bytes]:
    """The serialized first message (header only, no offset or data) of each part's stream."""
    header = pb.UploadHeader(dtype=op.dtype, shape=op.shape)
    if device is not None:
        header.device = int(device)
    if len(parts) > 1:
        header.upload_id = new_upload_id()
        header.parts = len(parts)
    out = []
    for begin, end in parts:
        h = pb.UploadHeader()
        h.CopyFrom(header)
        if len(parts) > 1:
            h.part_begin, h.part_end = begin, end
        out.append(pb.UploadRequest(header=h).SerializeToString())
    return out


def upload_messages(header: bytes, data: memoryview, part: Tuple[int, int],
                    chunk_bytes: int,
                    ready: Optional[Callable[[int], bool]] = None) -> Iterator[bytes]:
    """The messages of one upload stream: the header with the first chunk, then the other
    chunks of `part`, each with its offset (one empty chunk for an empty tensor). Each message
    is one copy of its chunk. ready(upto), when given, is called before a message is built
    from bytes below `upto` (it may wait until they are in `data`); False ends the stream
    there."""
    begin, end = part
    offset = begin
    first = True
    while True:
        n = min(chunk_bytes, end - offset)
        if ready is not None and not ready(offset + n):
            return
        pieces = [header] if first else []
        if offset:
            pieces.append(_UPLOAD_OFFSET + _wire.varint(offset))
        if n:
            pieces += [_UPLOAD_DATA + _wire.varint(n), data[offset:offset + n]]
        yield b"".join(pieces)
        first = False
        offset += n
        if offset >= end:
            return


def upload_response(raw: bytes) -> pb.TensorInfo:
    response = pb.UploadResponse.FromString(raw)
    if not response.HasField("tensor"):
        raise ComputeError(grpc.StatusCode.INTERNAL,
                           "upload: the server answered without a TensorInfo")
    return response.tensor


def same_tensor(infos: List[pb.TensorInfo]) -> pb.TensorInfo:
    for info in infos[1:]:
        if info.handle != infos[0].handle:
            raise ComputeError(grpc.StatusCode.INTERNAL,
                               "upload: the server answered the parts of one upload with "
                               f"different tensors ({infos[0].handle!r}, {info.handle!r})")
    return infos[0]


def download_request(handle: str, offset: int, length: int, chunk_bytes: int) -> bytes:
    return pb.DownloadRequest(handle=handle, offset=offset, length=length,
                              chunk_bytes=chunk_bytes).SerializeToString()


def read_download(raw: bytes) -> Tuple[pb.DownloadResponse, memoryview]:
    """A DownloadResponse without its data, and the data (a view of `raw`)."""
    rest, datas = _wire.strip(raw, _DOWNLOAD_SPEC)
    return pb.DownloadResponse.FromString(rest), datas.get((3,), memoryview(b""))


def check_part(message: pb.DownloadResponse, handle: str, nbytes: int, begin: int,
               end: int) -> None:
    """INTERNAL unless the first message of the stream of bytes [begin, end) describes the
    tensor the first stream did (`handle`, `nbytes`)."""
    if message.tensor.handle != handle or message.tensor.bytes != nbytes:
        raise ComputeError(grpc.StatusCode.INTERNAL,
                           f"download: the stream of bytes [{begin}, {end}) began with another "
                           f"TensorInfo ({message.tensor.handle!r}, {message.tensor.bytes} "
                           "bytes) than the first")


class Sink:
    """Where a download's bytes go: a flat uint8 view of the destination array, with the
    checks of each chunk's place in its stream's range."""

    def __init__(self, info: pb.TensorInfo, out: Optional[np.ndarray], bfloat16: str,
                 handle: str) -> None:
        if info.bytes < 0:
            raise ComputeError(grpc.StatusCode.INTERNAL,
                               f"download: {handle!r} has {info.bytes} bytes")
        dtype = numpy_dtype(info.dtype, bfloat16)
        shape = tuple(info.shape)
        if out is None:
            out = np.empty(shape, dtype=dtype)
        elif out.nbytes != info.bytes or not out.flags.c_contiguous or not out.flags.writeable:
            raise invalid("out", f"{out.nbytes} bytes ({'' if out.flags.c_contiguous else 'not '}"
                                 f"contiguous, {'' if out.flags.writeable else 'not '}"
                                 f"writable), but {handle!r} has {info.bytes} bytes")
        self.array = out
        self.flat = out.reshape(-1).view(np.uint8) if out.size else np.empty(0, np.uint8)
        self.info = info

    def put(self, offset: int, data: memoryview) -> None:
        n = data.nbytes
        if n:
            self.flat[offset:offset + n] = np.frombuffer(data, dtype=np.uint8)


class Range:
    """The bytes one download stream delivers: [begin, until) of the [begin, end) it asked
    for; past `until` they are another stream's."""

    def __init__(self, begin: int, end: int, until: int) -> None:
        self.next = begin
        self.begin, self.end, self.until = begin, end, until

    def take(self, message: pb.DownloadResponse, data: memoryview, sink: Sink) -> bool:
        """Puts the part of a message below `until` into the sink; True when the stream has
        delivered its part. INTERNAL for a chunk out of order or past the range."""
        n = data.nbytes
        if message.offset != self.next or n > self.end - self.next:
            raise ComputeError(grpc.StatusCode.INTERNAL,
                               f"download: the server sent bytes [{message.offset}, "
                               f"{message.offset + n}) where [{self.next}, ...) of "
                               f"[{self.begin}, {self.end}) was due")
        wanted = min(n, self.until - self.next)
        if wanted > 0:
            sink.put(self.next, data[:wanted])
        self.next += n
        return self.next >= self.until

    def finished(self) -> None:
        """Checks a stream that ended on its own."""
        if self.next < self.until:
            raise ComputeError(grpc.StatusCode.INTERNAL,
                               f"download: the stream ended at byte {self.next} of "
                               f"[{self.begin}, {self.end})")
