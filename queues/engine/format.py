"""The stored format's versions: what version each record a partition keeps in the key-value
store is in, and the check that refuses a version this release does not read.

The records, and their version 1 (the bytes every release so far has written):

============  ==========================================  =====================================
kind          key (``queues.engine.keys``)                version 1
============  ==========================================  =====================================
message       ``<q>/<p>/<block id>/<index>``; the archive  a JSON object: ``{"b": body, "t": ...}``
              journal's entries; the archive table's raw  (``StoredMessage.to_bytes``)
block         ``<q>/<p>/_blocks/<block id>``               a JSON list of 9 (``Block.to_bytes``)
head          ``<q>/<p>/_head``                            a JSON list ``[epoch, head id]``
receives      ``<q>/<p>/_receives/...``                    an integer in ASCII decimal
ack time      ``<q>/<p>/_archive/a.<block id>.<index>``    a float in ASCII decimal (``repr``)
============  ==========================================  =====================================

Not versioned: the fence (``_fence``), an integer that the stores' own compare-and-set scripts
read, which is the key-value store's contract (``queues.kv.base``), not the partition's; a
subscription's ack markers (``_acks``), whose value is never read (the name says it all).

**Version 1 is unmarked**: it is exactly the bytes the release before this one writes and
reads, so that during a rolling upgrade both releases read each other's records. A message's
optional ``"k"`` (its fairness key) is version 1 too: a release that does not know it reads
the rest of the record as before and ignores it (``from_bytes`` reads the keys it knows), so
what it loses is the key's fair turns while it serves the partition, never the message.

**A record of a later version N is the envelope** ``{"v": N, "d": <the record>}``: a JSON object of
exactly those two keys, ``"v"`` first. Nodes of the release before this one read every record
without a check, and they may share the stores with nodes of a later release during a rolling
upgrade; the envelope is chosen so that each of their decoders *fails* on it (the call fails,
or the partition does not open), never takes it for a record of its own:

- message: ``StoredMessage.from_bytes`` reads ``d["b"]``; an envelope has no ``"b"``: KeyError.
  (A ``"v"`` beside version 1's keys would be ignored, and any change of their meaning misread.)
- block: ``Block(*record)`` takes a list of 9 field by field, whatever is in it: a version in
  place of a field, or a list of 9 whose fields mean something else, would be misread; an
  object is unpacked as its *keys*, so an object of 9 keys would be too. Two keys: two
  arguments for nine fields, TypeError.
- head: ``epoch, head_id = record`` takes any pair: ``[2, payload]`` would be misread as epoch 2
  and head ``payload``. The envelope unpacks as its keys, ``"v"`` and ``"d"``, and
  ``int("v")`` is a ValueError (hence ``"v"`` first).
- receives, ack time: ``int(raw)`` / ``float(raw)`` on ``{...``: ValueError.

This release tells an envelope from version 1 at the cost of one look-up per record read, and
nothing on the write path: a message record of version 1 never holds ``"v"`` (``"v" in d``);
block and head records of version 1 are lists (``type(r) is list``); counts and times of
version 1 are numbers (checked only when ``int``/``float`` fails). An envelope of a version
later than :data:`CURRENT` is refused with :class:`~queues.errors.StoredFormatTooNew` (503: a
node of the newer release serves the partition), logged at ERROR with its key and version;
anything else that is not version 1 is :class:`CorruptRecord` (a fault: 500).

This release writes version 1 only. A release that brings version 2 reads versions 1 and 2
(here: one more entry in :data:`READS` and its decoder); it may *write* version 2 only once no
node of a release that cannot read it is left (an upgrade in two steps: first the reader, then
the writer), and never while a node of the release before this one may still run.
"""

from __future__ import annotations

import logging
from typing import NoReturn

import orjson

from queues.errors import Fault, StoredFormatTooNew

log = logging.getLogger(__name__)

#: The version this release writes (always unmarked: see the module docstring).
CURRENT = 1
#: The versions this release reads.
READS = frozenset({1})
#: The envelope's keys, for a record of a version after 1: ``{"v": version, "d": record}``.
VERSION = "v"
DATA = "d"


class CorruptRecord(Fault):
    """A record in the store that is neither version 1 nor an envelope of a later version."""


def envelope(version: int, record: object) -> bytes:
    """A record of ``version`` (2 or later) as a later release will store it; for tests, and for
    the release that brings version 2."""
    if version < 2:
        raise ValueError("version 1 is unmarked")
    return orjson.dumps({VERSION: version, DATA: record})


def refuse(key: str, kind: str, record: object) -> NoReturn:
    """Raise for ``record`` (decoded JSON, or None for bytes that are not JSON), a ``kind``
    record found under ``key`` that is not version 1: :class:`StoredFormatTooNew` (logged at
    ERROR) for an envelope of a later version, :class:`CorruptRecord` for anything else."""
    version = record.get(VERSION) if isinstance(record, dict) and record.keys() == {VERSION, DATA} else None
    if type(version) is int and version > CURRENT:
        log.error(
            "%s: %s record in stored format version %s, newer than this release reads (%s): refused",
            key,
            kind,
            version,
            CURRENT,
        )
        raise StoredFormatTooNew(key, kind, version, CURRENT)
    raise CorruptRecord(f"{key}: unreadable {kind} record")


def _decoded(raw: bytes) -> object:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def read_count(raw: bytes, key: str) -> int:
    """A receive count (version 1: an integer in ASCII decimal)."""
    try:
        return int(raw)
    except ValueError:
        refuse(key, "receive count", _decoded(raw))


def read_ack_time(raw: bytes, key: str) -> float:
    """An archive journal's ack time (version 1: epoch seconds, a float in ASCII decimal)."""
    try:
        return float(raw)
    except ValueError:
        refuse(key, "ack time", _decoded(raw))
