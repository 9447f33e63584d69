"""An offline W&B run's records read back from its ``run-*.wandb`` file (a LevelDB-style log of protobuf records)."""

from __future__ import annotations

import json
import struct
import time

BLOCK = 32768
HEADER = 7  # the file starts with "W&B", a magic number and a version; each chunk with crc32, length and kind
WHOLE, LAST = 1, 4


def records(path: str):
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if left < HEADER or (kind == 0 and length == 0):  # the block's padding
            pos += left
            continue
        pending += data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind in (WHOLE, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def finished(path: str, timeout: float = 60.0) -> list[str]:
    """Wait until W&B's service has written the run's ``exit`` record (it writes the file on its own, after
    ``run.finish()`` returns; on a busy machine later); the record kinds in the file, in order."""
    deadline = time.monotonic() + timeout
    while True:
        kinds = [r.WhichOneof("record_type") for r in records(path)]
        if "exit" in kinds or time.monotonic() > deadline:
            return kinds
        time.sleep(0.2)


def history(path: str) -> list[dict]:
    """Each ``run.log`` call's values (with W&B's own ``_step``), in order."""
    return [{_key(item): json.loads(item.value_json) for item in r.history.item}
            for r in records(path) if r.WhichOneof("record_type") == "history"]


def saved_files(path: str) -> list[str]:
    return [f.path for r in records(path) if r.WhichOneof("record_type") == "files" for f in r.files.files]


def config(path: str) -> dict:
    return {_key(item): json.loads(item.value_json) for r in records(path) if r.WhichOneof("record_type") == "run"
            for item in r.run.config.update}


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)  # W&B writes a name in one field or the other
