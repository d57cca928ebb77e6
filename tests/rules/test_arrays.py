"""raypack.rules.arrays builds the arrays pyarrow's own conversions build, from the buffers."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from raypack.rules.arrays import arrow_array, binary_array, from_stream_bytes, numpy_values, stream_bytes

DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.float32, np.float64]


@pytest.mark.parametrize("dtype", DTYPES + [np.bool_])
def test_arrow_array_equals_pyarrows_conversion(dtype):
    rng = np.random.default_rng(0)
    values = (rng.integers(0, 100, size=37) % (2 if dtype is np.bool_ else 100)).astype(dtype)
    for view in (values, values[3:20], values[::3], values[:0]):  # contiguous, a slice, strided, empty
        got = arrow_array(view)
        assert got.equals(pa.array(view)) and got.type == pa.array(view).type and got.null_count == 0
        got.validate(full=True)


def test_arrow_array_takes_a_type_and_shares_memory():
    values = np.arange(10, dtype=np.int64)
    assert arrow_array(values, pa.int32()).equals(pa.array(values, pa.int32()))
    shared = arrow_array(values)
    values[0] = 99  # no copy: the array sees the change
    assert shared[0].as_py() == 99
    with pytest.raises(ValueError, match="1-D"):
        arrow_array(np.zeros((2, 2)))


@pytest.mark.parametrize("dtype", DTYPES + [np.bool_])
def test_numpy_values_equals_to_numpy(dtype):
    array = pa.array((np.arange(50) % (2 if dtype is np.bool_ else 50)).astype(dtype))
    for view in (array, array.slice(7, 30), array.slice(13), array.slice(5, 0)):  # offsets not byte-aligned too
        want = view.to_numpy(zero_copy_only=False)
        got = numpy_values(view)
        assert got.dtype == want.dtype and np.array_equal(got, want)


def test_numpy_values_with_nulls_and_chunks():
    with_nulls = pa.array([1, None, 3], pa.int64())
    assert np.array_equal(numpy_values(with_nulls), with_nulls.to_numpy(zero_copy_only=False), equal_nan=True)
    chunked = pa.chunked_array([pa.array([1, 2], pa.int32()), pa.array([3], pa.int32())])
    assert numpy_values(chunked).tolist() == [1, 2, 3] and numpy_values(chunked).dtype == np.int32
    empty = pa.chunked_array([], pa.uint16())
    assert numpy_values(empty).dtype == np.uint16 and numpy_values(empty).size == 0
    offsets = pa.array([[1, 2], [], [3]], pa.list_(pa.int64())).slice(1).offsets
    assert numpy_values(offsets).tolist() == offsets.to_pylist()


@pytest.mark.parametrize("arrow_type", [pa.binary(), pa.large_binary(), pa.string(), pa.large_string()])
def test_binary_array_equals_pyarrows(arrow_type):
    items = [b"", "héllo".encode(), b"\x00x", "日本".encode() * 50]
    got = binary_array(items, arrow_type)
    got.validate(full=True)
    want = pa.array(items, pa.large_binary()).cast(arrow_type)
    assert got.equals(want)
    assert binary_array([], arrow_type).equals(pa.array([], arrow_type))


def test_stream_bytes_round_trip():
    table = pa.table({"a": pa.array([1, None], pa.int64()), "b": pa.array([[1, 2], None], pa.list_(pa.uint16())),
                      "c": pa.array([{"x": "é"}, None], pa.struct([("x", pa.string())]))})
    data = stream_bytes(table)
    assert isinstance(data, bytes) and from_stream_bytes(data).equals(table)
