"""The records gateway instances exchange to share their prefix indexes (`gateway.fleet.prefix_sharing`),
and their encoding on the Redis stream.

A record is (pool, replica id, block hashes): hashes only, never prompt text. A batch is JSON
`[[pool, replica_id, hashes], ...]`, `hashes` the block hashes as big-endian unsigned 64-bit integers,
base64 (11 characters per block). Decoding a malformed batch raises `ValueError` naming what is wrong.
Apart from the exchange loop because the format is what every instance must agree on, and is tested
on its own.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class IndexRecord:
    """One routing record: `block_hashes` were sent to `replica_id` of `pool`."""

    pool: str
    replica_id: str
    block_hashes: tuple[int, ...]


def encode_batch(records: Sequence[IndexRecord]) -> str:
    """`[[pool, replica_id, base64(big-endian uint64 hashes)], ...]` as compact JSON; `ValueError` when a
    hash is not an unsigned 64-bit integer."""
    rows = []
    for record in records:
        try:
            packed = struct.pack(f">{len(record.block_hashes)}Q", *record.block_hashes)
        except struct.error:
            raise ValueError(f"a block hash for {record.replica_id} is not an unsigned 64 bits") from None
        rows.append([record.pool, record.replica_id, base64.b64encode(packed).decode("ascii")])
    return json.dumps(rows, separators=(",", ":"))


def decode_batch(payload: str) -> list[IndexRecord]:
    """The records of an encoded batch; `ValueError` naming what is wrong when it is malformed."""
    rows = json.loads(payload)
    if not isinstance(rows, list):
        raise ValueError("a batch must be a JSON list")
    records = []
    for row in rows:
        if not (isinstance(row, list) and len(row) == 3 and all(isinstance(f, str) for f in row)):
            raise ValueError(f"a record must be [pool, replica_id, hashes] strings, got {row!r:.80}")
        try:
            packed = base64.b64decode(row[2], validate=True)
        except binascii.Error as exc:
            raise ValueError(f"record hashes are not base64: {exc}") from None
        if len(packed) % 8:
            raise ValueError(f"record hashes are {len(packed)} bytes, not a multiple of 8")
        hashes = struct.unpack(f">{len(packed) // 8}Q", packed)
        records.append(IndexRecord(row[0], row[1], hashes))
    return records
