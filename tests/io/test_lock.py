"""The object-store lock's read-back: what it says when the store does not keep the upload as sent."""

from __future__ import annotations

import io
import json

import pytest

from raypack.errors import InputError
from raypack.io.lock import ObjectStoreLock, owner_record


class Store:
    """An object store in memory; ``mangle`` stands for a server that keeps other bytes than the upload's (moto
    given no credentials kept the aws-chunked body of an unsigned upload, trailer and all: an operator's trial)."""

    def __init__(self, mangle=None):
        self.objects, self.mangle = {}, mangle

    def open_output_stream(self, path):
        store = self

        class Upload(io.BytesIO):
            def close(self):
                data = self.getvalue()
                store.objects[path] = store.mangle(data) if store.mangle else data
                super().close()

        return Upload()

    def open_input_stream(self, path):
        if path not in self.objects:
            raise FileNotFoundError(path)
        return io.BytesIO(self.objects[path])

    def delete_file(self, path):
        del self.objects[path]


def test_a_lock_read_back_as_other_bytes_is_not_another_run_and_is_not_left_behind():
    store = Store(mangle=lambda data: b"2\r\n" + data + b"\r\n0\r\nx-amz-checksum-crc64nvme:Sv1wpwepjTw=\r\n\r\n")
    lock = ObjectStoreLock(store, "bkt/out/.raypack-lock.json", what="output s3://bkt/out")
    with pytest.raises(InputError) as e:
        lock.acquire()
    assert "read back holds other bytes than were written" in str(e.value)
    assert "check the credentials and the endpoint" in str(e.value)
    assert "another raypack run" not in str(e.value)  # it said "taken by another raypack run just now"
    assert store.objects == {}  # the next run is not told the output is being written


def test_a_lock_taken_by_another_run_between_the_write_and_the_read_back_says_so():
    other = {**owner_record(), "pid": 1, "host": "elsewhere"}
    store = Store(mangle=lambda data: json.dumps(other).encode())
    lock = ObjectStoreLock(store, "bkt/out/.raypack-lock.json", what="output s3://bkt/out")
    with pytest.raises(InputError, match="taken by another raypack run just now"):
        lock.acquire()
    plain = ObjectStoreLock(Store(), "bkt/out/.raypack-lock.json", what="output s3://bkt/out")
    plain.acquire()
    plain.release()
