"""A Parquet page body decompressed in parts of bounded size (raypack.inputs.parquet_pages).

``iter_body_parts(read, size, uncompressed, codec)`` yields the decompressed bytes of a page
body (the ``size`` compressed bytes ``read(pos, n)`` gives) as consecutive parts of about
``GROUP`` bytes, reading the compressed bytes a part at a time, so that neither the whole
compressed nor the whole decompressed body is held (a one-row page holds a whole document):

  * uncompressed: the body read ``GROUP`` bytes at a time;
  * snappy (raw format: a varint length, then literal and copy elements): the compressors of
    Google (C++, used by Arrow and parquet-mr), Go and Rust compress 64 KiB fragments
    independently, so a copy never reaches before its fragment. The element tags are walked
    (Python per element; ~5M elements/s: instant on incompressible data, ~0.2-0.3 elements
    per 16-bit token on text) to the element boundary where ``GROUP`` more bytes are out, and
    those elements are decompressed by pyarrow as a stream of their own. pyarrow checks that
    no copy reaches before the part and that the part gives exactly its length, so a part
    decompressed is the body's bytes; else (another compressor) the rest comes from one
    decompression of the whole body;
  * zstd, gzip, brotli: pyarrow's streaming decompressor (``pyarrow.CompressedInputStream``)
    reading the compressed bytes 64 KiB at a time; if its first part fails, one decompression;
  * lz4 (raw blocks, no stream format), and bodies of at most ``2 * GROUP`` bytes: one
    decompression (pyarrow).

Memory: one part (decompressed) and its compressed bytes; the whole body in the fallbacks.
"""

from __future__ import annotations

import io
from typing import Callable, Iterator

import pyarrow as pa

from raypack.inputs.parquet_pages.thrift_compact import read_varint

__all__ = ["GROUP", "iter_body_parts"]

GROUP = 1 << 22  # bytes of a part; a multiple of snappy's 64 KiB fragments
_FRAGMENT = 1 << 16
_TAG_BYTES = 5  # a snappy element's tag and extra bytes (a literal's payload aside)
_STREAMED = ("zstd", "gzip", "brotli")  # pyarrow decompresses these formats as streams
_MIN_STRIDE = 1 << 13  # compressed bytes walked at least before checking the bytes out

Read = Callable[[int, int], bytes]


def iter_body_parts(read: Read, size: int, uncompressed: int, codec: str | None) -> Iterator[memoryview]:
    """The decompressed body as consecutive parts (memoryviews) summing to its bytes.

    ``read(pos, n)``: the compressed body's bytes [pos, pos + n) (fewer at its end).
    ``uncompressed``: the body's decompressed size (page header). Errors: pyarrow's for a
    malformed body, raised by the whole-body decompression.
    """
    if codec is None:
        for start in range(0, size, GROUP):
            yield memoryview(read(start, min(GROUP, size - start)))
        return
    if codec == "snappy" and uncompressed > 2 * GROUP and GROUP % _FRAGMENT == 0:
        yield from _snappy_parts(read, size, uncompressed)
        return
    if codec in _STREAMED and uncompressed > 2 * GROUP:
        yield from _streamed_parts(read, size, uncompressed, codec)
        return
    yield _decompress(read(0, size), uncompressed, codec)


def _decompress(data, uncompressed: int, codec: str) -> memoryview:
    return memoryview(pa.Codec(codec).decompress(data, decompressed_size=uncompressed)).cast("B")


def _streamed_parts(read: Read, size: int, uncompressed: int, codec: str) -> Iterator[memoryview]:
    """Parts of GROUP bytes from pyarrow's streaming decompressor; one decompression if the first fails."""
    stream = pa.CompressedInputStream(pa.PythonFile(_Region(read, size), mode="r"), codec)
    try:
        part = stream.read(min(GROUP, uncompressed))
    except (pa.ArrowException, OSError):
        yield _decompress(read(0, size), uncompressed, codec)
        return
    left = uncompressed
    while left > 0:
        if not part:
            raise ValueError(f"the page body decompresses to {uncompressed - left} bytes, not {uncompressed}")
        yield memoryview(part)
        left -= len(part)
        part = stream.read(min(GROUP, left)) if left > 0 else b""


class _Region(io.RawIOBase):
    """The compressed body as a file pyarrow reads forward (``read(pos, n)`` per read)."""

    def __init__(self, read: Read, size: int) -> None:
        self.read_at, self.size, self.pos = read, size, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.read_at(self.pos, min(len(buffer), self.size - self.pos))
        buffer[:len(data)] = data
        self.pos += len(data)
        return len(data)


def _snappy_parts(read: Read, size: int, uncompressed: int) -> Iterator[memoryview]:
    """Parts of GROUP bytes cut at element boundaries (see the module docstring), the rest whole."""
    window = _Compressed(read, size)
    length, start = read_varint(window.bytes_to(10), 0)
    if length != uncompressed:
        yield _decompress(read(0, size), uncompressed, "snappy")
        return
    out_start, ratio = 0, 0.25
    while uncompressed - out_start > GROUP:
        part, end = _snappy_part(window, start, ratio)
        if part is None:
            del window
            yield _decompress(read(0, size), uncompressed, "snappy")[out_start:]
            return
        yield part
        window.drop_before(end)
        start, out_start, ratio = end, out_start + GROUP, (end - start) / GROUP
    last = uncompressed - out_start
    yield _decompress(_varint(last) + window.read(start, size - start), last, "snappy")


def _snappy_part(window: _Compressed, start: int, ratio: float) -> tuple[memoryview | None, int]:
    """The GROUP bytes decompressed from the elements at ``start``, and the position after them;
    (None, start) when no element ends at GROUP bytes or pyarrow refuses the part. ``ratio``:
    compressed bytes per byte out expected (the previous part's): the walk goes in strides
    of half of what is left to reach GROUP, checked only between strides."""
    pos, out = start, 0
    while out < GROUP:
        if pos + _MIN_STRIDE + _TAG_BYTES > window.end:
            window.bytes_to(max(pos, window.end) + GROUP + GROUP // 4)  # read on, a part's worth
        data = window.data
        limit = window.end - window.start if window.end == window.size else len(data) - _TAG_BYTES
        local = pos - window.start
        if local >= limit:
            return None, start  # the elements end before GROUP bytes
        stride_end = min(limit, local + max(int((GROUP - out) * ratio // 2), _MIN_STRIDE))
        end, stride_out = _walk(data, local, stride_end, out)
        if stride_out > GROUP:  # the stride went past GROUP: again, stopping there
            end, stride_out = _walk(data, local, stride_end, out, GROUP)
        pos, out = end + window.start, stride_out
        ratio = (pos - start) / out if out else ratio
    if out != GROUP or pos > window.size:
        return None, start  # an element crosses the part's end: not cut in fragments
    try:
        compressed = _varint(GROUP) + window.read(start, pos - start)
        return _decompress(compressed, GROUP, "snappy"), pos
    except (pa.ArrowException, OSError):
        return None, start


class _Compressed:
    """The compressed body's bytes from ``start`` (the current part's) to ``end``, read on demand."""

    def __init__(self, read: Read, size: int) -> None:
        self.read_at, self.size = read, size
        self.data, self.start = b"", 0

    @property
    def end(self) -> int:
        return self.start + len(self.data)

    def bytes_to(self, end: int) -> bytes:
        """The held bytes, read on to ``end`` (clipped to the body) if they end before it."""
        end = min(end, self.size)
        if end > self.end:
            more = self.read_at(self.end, end - self.end)
            if len(more) != end - self.end:
                raise OSError(f"read {len(more)} bytes of {end - self.end}")
            self.data += more
        return self.data

    def read(self, start: int, n: int) -> bytes:
        """Bytes [start, start + n) (start >= self.start), read on if needed."""
        data = self.bytes_to(start + n)
        if start + n > self.end:
            raise OSError("the compressed body is shorter than its elements")
        return data[start - self.start:start - self.start + n]

    def drop_before(self, start: int) -> None:
        self.data, self.start = self.data[start - self.start:], start


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _tables() -> tuple[list[int], list[int]]:
    """Per tag byte: the element's bytes and output bytes (0, 0 for a literal with extra length bytes)."""
    steps, outs = [0] * 256, [0] * 256
    for tag in range(256):
        kind, high = tag & 3, tag >> 2
        if kind == 0 and high < 60:
            steps[tag], outs[tag] = high + 2, high + 1
        elif kind:
            steps[tag] = (0, 2, 3, 5)[kind]
            outs[tag] = (high & 7) + 4 if kind == 1 else high + 1
    return steps, outs


_STEPS, _OUTS = _tables()


def _walk(data: bytes, pos: int, limit: int, out: int, stop: int = -1, steps: list[int] = _STEPS,
          outs: list[int] = _OUTS) -> tuple[int, int]:
    """Walk the elements whose tags start in [pos, limit), adding their bytes to ``out``; with
    ``stop`` >= 0, stop once out >= stop. Returns (position after the last element walked,
    out). Python per element (~5M elements/s; without ``stop``, ~30% faster)."""
    if stop >= 0:  # strides without the check, halved when they pass stop: ~2x the elements
        stride = max(limit - pos, 1)
        while pos < limit and out < stop:
            end, stride_out = _walk(data, pos, min(limit, pos + stride), out)
            if stride_out <= stop or stride == 1:
                pos, out = end, stride_out
            else:
                stride //= 2
        return pos, out
    while pos < limit:
        tag = data[pos]
        step = steps[tag]
        if step:
            pos += step
            out += outs[tag]
        else:
            num_bytes = (tag >> 2) - 59
            length = int.from_bytes(data[pos + 1:pos + 1 + num_bytes], "little") + 1
            pos += 1 + num_bytes + length
            out += length
    return pos, out
