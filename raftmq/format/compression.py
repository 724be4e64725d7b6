"""Compression codecs of a DATA entry's records payload (docs/format.md, "Codecs").

The producer compresses the encoded records of a batch as one frame of its codec and sets
the codec in the entry's attributes; the header (offsets, counts, timestamps, producer
fields) stays uncompressed, so the broker assigns offsets and serves fetches without
touching the payload, and stores the compressed bytes as they came. It decompresses a
produced entry once, to check its records, and never whole: :func:`iter_decompressed`
yields bounded chunks, so a small request that inflates to a large payload costs the
broker one chunk and one record of memory, not the payload.

Why these codecs: Kafka's numbering (1 gzip, 3 lz4, 4 zstd) so a port's constants carry
over; gzip needs nothing beyond the standard library, lz4 is the cheap one, zstd the one
that compresses best for its CPU. Snappy (2) is refused: its Kafka framing is a
non-standard xerial stream, and zstd is better on both counts.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from enum import IntEnum

import lz4.frame
import zstandard

from raftmq.format.errors import InvalidEntryError

CHUNK_BYTES = 256 * 1024
"""Decompressed bytes produced per step of a streaming decompression."""
MAX_UNCOMPRESSED_PAYLOAD_BYTES = 64 * 1024 * 1024
"""The most a compressed payload may inflate to. It bounds what a consumer must hold for
one entry (it decodes an entry's records at once) and the broker's work per entry; the
same figure as the largest entry (entry.MAX_ENTRY_BYTES), so that compressing a batch never
lets it carry more than it could uncompressed."""
_INPUT_STEP_BYTES = 16 * 1024


class Codec(IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2  # Kafka's number; refused here (see the module docstring)
    LZ4 = 3
    ZSTD = 4


SUPPORTED = (Codec.GZIP, Codec.LZ4, Codec.ZSTD)
NAMES: dict[Codec, str] = {c: c.name.lower() for c in Codec if c != Codec.NONE}


def codec_named(name: str | None) -> Codec:
    """The codec a user names ('gzip', 'lz4', 'zstd', or None / 'none' for none)."""
    if name is None or name == "none":
        return Codec.NONE
    for codec in SUPPORTED:
        if NAMES[codec] == name:
            return codec
    choices = ", ".join(repr(NAMES[c]) for c in SUPPORTED)
    raise ValueError(f"compression {name!r} is not supported; use {choices} or None")


def unsupported_reason(codec: int) -> str | None:
    """Why entries with codec bits ``codec`` cannot be taken, or None when they can."""
    if codec == Codec.NONE or codec in SUPPORTED:
        return None
    if codec == Codec.SNAPPY:
        return "snappy (codec 2) is not supported; compress with gzip (1), lz4 (3) or zstd (4)"
    return f"codec {codec} is not defined; use 0 (none), gzip (1), lz4 (3) or zstd (4)"


def compress(codec: Codec, data: bytes) -> bytes:
    """``data`` (encoded records) as one frame of ``codec``."""
    if codec == Codec.GZIP:
        c = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: the gzip container
        return c.compress(data) + c.flush()
    if codec == Codec.LZ4:
        return lz4.frame.compress(data, store_size=True)
    if codec == Codec.ZSTD:
        # The content size in the frame header is required (see _zstd_chunks).
        return zstandard.ZstdCompressor(level=3, write_content_size=True).compress(data)
    raise ValueError(f"cannot compress with {codec!r}")


def decompress(codec: int, payload: bytes | memoryview) -> bytes:
    """The whole decompressed payload (a consumer decoding an entry), checked as
    :func:`iter_decompressed` checks it."""
    return b"".join(iter_decompressed(codec, payload))


def iter_decompressed(
    codec: int, payload: bytes | memoryview, chunk_bytes: int | None = None
) -> Iterator[bytes]:
    """The decompressed payload in chunks of at most ``chunk_bytes`` (CHUNK_BYTES). Raises
    InvalidEntryError (saying what is wrong) for a payload that is not exactly one whole
    frame of ``codec``, or that inflates past MAX_UNCOMPRESSED_PAYLOAD_BYTES."""
    reason = unsupported_reason(codec)
    if reason is not None or codec == Codec.NONE:
        raise InvalidEntryError(reason or "the payload is not compressed")
    name = NAMES[Codec(codec)]
    chunks = {Codec.GZIP: _gzip_chunks, Codec.LZ4: _lz4_chunks, Codec.ZSTD: _zstd_chunks}
    total = 0
    try:
        for chunk in chunks[Codec(codec)](memoryview(payload), chunk_bytes or CHUNK_BYTES):
            total += len(chunk)
            if total > MAX_UNCOMPRESSED_PAYLOAD_BYTES:
                raise InvalidEntryError(
                    f"the {name} payload inflates past {MAX_UNCOMPRESSED_PAYLOAD_BYTES} bytes, "
                    "the most one entry may hold uncompressed; send smaller batches"
                )
            if chunk:
                yield chunk
    except (zlib.error, RuntimeError, zstandard.ZstdError) as exc:  # lz4 raises RuntimeError
        raise InvalidEntryError(f"the payload is not valid {name} data: {exc}") from None


def _gzip_chunks(payload: memoryview, chunk_bytes: int) -> Iterator[bytes]:
    d = zlib.decompressobj(31)
    pending: bytes | memoryview = payload
    while pending and not d.eof:
        yield d.decompress(pending, chunk_bytes)
        pending = d.unconsumed_tail
    if not d.eof:
        raise InvalidEntryError("the gzip payload is cut short (its frame does not end)")
    if d.unused_data or pending:
        raise InvalidEntryError("the gzip payload has bytes after its frame")


def _lz4_chunks(payload: memoryview, chunk_bytes: int) -> Iterator[bytes]:
    d = lz4.frame.LZ4FrameDecompressor()
    pos = 0
    while not d.eof:
        piece: bytes | memoryview = b""
        if d.needs_input:
            if pos >= len(payload):
                raise InvalidEntryError("the lz4 payload is cut short (its frame does not end)")
            piece, pos = payload[pos : pos + _INPUT_STEP_BYTES], pos + _INPUT_STEP_BYTES
        yield d.decompress(piece, max_length=chunk_bytes)
    if d.unused_data or pos < len(payload):
        raise InvalidEntryError("the lz4 payload has bytes after its frame")


def _zstd_chunks(payload: memoryview, chunk_bytes: int) -> Iterator[bytes]:
    """zstd's streaming reader neither notices a frame cut short nor stops at the frame's
    end, so the frame must declare its content size (producers here always write it), and
    exactly that many bytes must come out."""
    try:
        declared = zstandard.frame_content_size(payload)
    except zstandard.ZstdError as exc:
        raise InvalidEntryError(f"the payload is not a zstd frame: {exc}") from None
    if declared < 0:
        raise InvalidEntryError(
            "the zstd frame does not declare its content size; compress with the content "
            "size written (zstd's default for one-shot compression)"
        )
    if declared > MAX_UNCOMPRESSED_PAYLOAD_BYTES:
        raise InvalidEntryError(
            f"the zstd frame declares {declared} bytes, past the "
            f"{MAX_UNCOMPRESSED_PAYLOAD_BYTES} one entry may hold uncompressed; send smaller "
            "batches"
        )
    reader = zstandard.ZstdDecompressor().stream_reader(
        payload, read_size=_INPUT_STEP_BYTES, read_across_frames=False
    )
    total = 0
    while True:
        chunk = reader.read(chunk_bytes)
        if not chunk:
            break
        total += len(chunk)
        if total > declared:
            raise InvalidEntryError(
                f"the zstd payload holds more than the {declared} bytes its frame declares "
                "(bytes after the frame?)"
            )
        yield chunk
    if total != declared:
        raise InvalidEntryError(
            f"the zstd payload is cut short: {total} of the {declared} bytes its frame declares"
        )
