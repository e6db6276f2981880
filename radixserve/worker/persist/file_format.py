"""The warm-restart file: cached prefixes' token ids and KV, versioned and checksummed.

Layout (little-endian)::

    b"RSPREFIX"  u32 version  u64 header_len  header (UTF-8 JSON)  zero padding to 64 bytes
    tokens      int64 [T]                      (every node's tokens, in node order)
    K layer 0, V layer 0, K layer 1, ...       [T, kv_heads, head_dim] in the fingerprint's dtype
    sha256 of everything above (32 bytes)

The header holds the model ``fingerprint`` (a dict that must equal the reader's, see
``prefix_store.fingerprint``), ``num_tokens`` and ``nodes`` as ``[parent, salt, length]``.
Nothing is unpickled: the reader parses JSON and views raw buffers, and refuses (raising
``PrefixFileError``) a wrong magic or version, a bad checksum, a short or long file, or a
header that does not add up.  ``write_prefix_file`` is atomic: a temporary file in the same
directory, fsync, ``os.replace``, so the final name only ever holds a complete file.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from radixserve.ipc.persist_link import PersistNode

MAGIC = b"RSPREFIX"
VERSION = 1
_ALIGN = 64
_DIGEST = 32
_FIXED = struct.Struct("<IQ")


class PrefixFileError(ValueError):
    """The file is not a complete, intact prefix file of this format."""


@dataclass
class PrefixFile:
    fingerprint: dict[str, Any]
    nodes: list[PersistNode]
    k: list[torch.Tensor]  # per layer [T, kv_heads, head_dim], views into the file's buffer
    v: list[torch.Tensor]

    @property
    def num_tokens(self) -> int:
        return sum(len(n.tokens) for n in self.nodes)


def _raw(t: torch.Tensor) -> memoryview:
    return memoryview(t.detach().cpu().contiguous().view(torch.uint8).numpy()).cast("B")


def write_prefix_file(path: str, fingerprint: dict[str, Any], nodes: Sequence[PersistNode],
                      k: Sequence[torch.Tensor], v: Sequence[torch.Tensor]) -> int:
    """Write the file atomically; returns its size in bytes.  ``k[l]``/``v[l]`` hold the KV of
    every node's tokens in node order."""
    tokens = np.concatenate([n.tokens for n in nodes]).astype("<i8") if nodes else np.zeros(0, "<i8")
    header = json.dumps({"fingerprint": fingerprint, "num_tokens": int(tokens.size),
                         "nodes": [[n.parent, n.salt, int(len(n.tokens))] for n in nodes]}).encode()
    head = MAGIC + _FIXED.pack(VERSION, len(header)) + header
    head += b"\0" * (-len(head) % _ALIGN)
    parts = [memoryview(head), memoryview(tokens).cast("B")]
    for kl, vl in zip(k, v):
        parts += [_raw(kl), _raw(vl)]
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    try:
        digest, size = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as f:
            for part in parts:
                digest.update(part)
                f.write(part)
                size += len(part)
            f.write(digest.digest())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash
    finally:
        os.close(dir_fd)
    return size + _DIGEST


def read_prefix_file(path: str) -> PrefixFile:
    """Read and verify a file; raises ``PrefixFileError`` naming what is wrong (OSError when it
    cannot be read at all)."""
    with open(path, "rb") as f:
        buf = bytearray(os.fstat(f.fileno()).st_size)
        if f.readinto(buf) != len(buf):
            raise PrefixFileError("short read")
    if len(buf) < len(MAGIC) + _FIXED.size + _DIGEST or bytes(buf[:len(MAGIC)]) != MAGIC:
        raise PrefixFileError("not a prefix file (bad magic or too short)")
    if hashlib.sha256(memoryview(buf)[:-_DIGEST]).digest() != bytes(buf[-_DIGEST:]):
        raise PrefixFileError("checksum mismatch (corrupt or truncated)")
    version, header_len = _FIXED.unpack_from(buf, len(MAGIC))
    if version != VERSION:
        raise PrefixFileError(f"format version {version}, expected {VERSION}")
    start = len(MAGIC) + _FIXED.size
    try:
        header = json.loads(bytes(buf[start:start + header_len]))
        fp, total = dict(header["fingerprint"]), int(header["num_tokens"])
        shapes = [(int(p), s, int(n)) for p, s, n in header["nodes"]]
        dtype = getattr(torch, fp["dtype"])
        layers, heads, dim = int(fp["num_layers"]), int(fp["num_kv_heads"]), int(fp["head_dim"])
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise PrefixFileError(f"bad header: {type(e).__name__}: {e}") from None
    if (sum(n for _, _, n in shapes) != total or any(not -1 <= p < i or n < 0 for i, (p, _, n) in enumerate(shapes))
            or any(s is not None and not isinstance(s, str) for _, s, _ in shapes)):
        raise PrefixFileError("bad header: node table does not add up")
    off = start + header_len
    off += -off % _ALIGN
    per = total * heads * dim
    kv_bytes = per * torch.tensor([], dtype=dtype).element_size()
    if off + 8 * total + 2 * layers * kv_bytes + _DIGEST != len(buf):
        raise PrefixFileError("size does not match the header")
    tokens = np.frombuffer(buf, "<i8", total, off).astype(np.int64)
    nodes, at = [], 0
    for parent, salt, n in shapes:
        nodes.append(PersistNode(parent, salt, tokens[at:at + n]))
        at += n
    off += 8 * total
    k, v = [], []
    for _ in range(layers):
        for out in (k, v):
            out.append(torch.frombuffer(buf, dtype=dtype, count=per, offset=off).view(total, heads, dim)
                       if total else torch.empty(0, heads, dim, dtype=dtype))
            off += kv_bytes
    return PrefixFile(fp, nodes, k, v)
