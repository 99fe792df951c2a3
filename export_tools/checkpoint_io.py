"""Reading variables from a TF checkpoint in row chunks, and writing one in slices.

TF's `RestoreV2` with a slice spec reads the *whole* stored tensor and copies
the slice out, so reading a 4 GiB table chunk by chunk through it would cost
4 GiB per chunk. Tensors stored whole are therefore read straight from the
bundle's data file: the index (a LevelDB-format table of `BundleEntryProto`)
gives each tensor's shard, offset and size, and a row chunk is a contiguous
byte range of it. Tensors stored as slices (TF1 partitioned variables) are
read through `RestoreV2`, one stored slice at a time.

Writing streams too (`StreamingBundleWriter`): each tensor is appended chunk
by chunk and stored whole.
"""
import ctypes
import dataclasses
import os
import struct

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import tensor_bundle_pb2

from export_tools.errors import ExportError

_TABLE_MAGIC = 0xDB4775248B80FB57
_FOOTER_BYTES = 48
_BLOCK_TRAILER_BYTES = 5  # compression type byte + crc32c


def _varint(buf, pos):
    value, shift = 0, 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _block_entries(data, offset, size, where):
    """Yields (key, value) of one LevelDB-format block (prefix-compressed keys)."""
    if data[offset + size] != 0:
        raise ExportError(f"{where}: compressed index blocks are not supported")
    block = data[offset:offset + size]
    num_restarts = struct.unpack_from("<I", block, len(block) - 4)[0]
    end = len(block) - 4 - 4 * num_restarts
    pos, key = 0, b""
    while pos < end:
        shared, pos = _varint(block, pos)
        unshared, pos = _varint(block, pos)
        value_len, pos = _varint(block, pos)
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        yield key, block[pos:pos + value_len]
        pos += value_len


def read_bundle_index(prefix):
    """Returns (num_shards, {key: BundleEntryProto}) from `prefix.index`."""
    path = prefix + ".index"
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ExportError(f"cannot read the checkpoint index {path}: {e.strerror}") from e
    try:
        if len(data) < _FOOTER_BYTES or struct.unpack_from(
                "<Q", data, len(data) - 8)[0] != _TABLE_MAGIC:
            raise ValueError("bad magic number")
        footer = data[len(data) - _FOOTER_BYTES:]
        _, pos = _varint(footer, 0)  # metaindex handle: unused
        _, pos = _varint(footer, pos)
        index_offset, pos = _varint(footer, pos)
        index_size, pos = _varint(footer, pos)
        entries, num_shards = {}, None
        for _, handle in _block_entries(data, index_offset, index_size, path):
            block_offset, hpos = _varint(handle, 0)
            block_size, _ = _varint(handle, hpos)
            for key, value in _block_entries(data, block_offset, block_size, path):
                if not key:  # the empty key holds the BundleHeaderProto
                    header = tensor_bundle_pb2.BundleHeaderProto()
                    header.ParseFromString(value)
                    num_shards = header.num_shards
                    continue
                entry = tensor_bundle_pb2.BundleEntryProto()
                entry.ParseFromString(value)
                entries[key.decode("utf-8", "replace")] = entry
        if num_shards is None:
            raise ValueError("no bundle header")
        return num_shards, entries
    except ExportError:
        raise
    except Exception as e:  # noqa: BLE001 - any parse failure means corruption
        raise ExportError(f"the checkpoint index {path} is corrupt ({e})") from e


@dataclasses.dataclass(frozen=True)
class VariableLocation:
    """Where one variable's value lives in a checkpoint.

    `key` is the checkpoint key; a partition of a TF1 partitioned variable is
    the block of `shape` at `offset` inside the stored tensor of `full_shape`.
    """
    name: str
    key: str
    full_shape: tuple
    offset: tuple
    shape: tuple
    dtype: tf.DType

    @property
    def uid(self):
        """Names the stored block: a partition and its whole variable differ."""
        return (self.key, self.offset, self.shape)

    @property
    def is_partition(self):
        return self.shape != self.full_shape

    @property
    def nbytes(self):
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.size

    def slice_spec(self, row_start, rows):
        dims = [f"{self.offset[0] + row_start},{rows}"] + [
            f"{o},{s}" for o, s in zip(self.offset[1:], self.shape[1:])]
        return " ".join(str(d) for d in self.full_shape) + " " + ":".join(dims)


class CheckpointReader:
    """Reads variables (whole, or in row chunks) from the checkpoint at `prefix`."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.num_shards, self.entries = read_bundle_index(prefix)
        try:
            reader = tf.train.load_checkpoint(prefix)
            self.shapes = reader.get_variable_to_shape_map()
            self.dtypes = reader.get_variable_to_dtype_map()
            self._reader = reader
        except Exception as e:  # noqa: BLE001 - TF raises several types here
            raise ExportError(f"cannot open the checkpoint {prefix}: "
                              f"{str(e).splitlines()[0]}") from e
        shard_bytes = {}
        for key, entry in self.entries.items():
            path = self._shard_path(entry.shard_id)
            if entry.size and not os.path.exists(path):
                raise ExportError(f"checkpoint shard {path} (holding {key!r}) "
                                  f"is missing")
            if path not in shard_bytes and os.path.exists(path):
                shard_bytes[path] = os.path.getsize(path)
            # Checked up front: TF's reader fails on a short shard with an
            # IndexError, and only once the tensor is read.
            if entry.size and entry.offset + entry.size > shard_bytes[path]:
                raise ExportError(
                    f"checkpoint shard {path} is truncated: {key!r} needs bytes "
                    f"[{entry.offset}, {entry.offset + entry.size}) of a "
                    f"{shard_bytes[path]}-byte file")

    def _shard_path(self, shard_id):
        return f"{self.prefix}.data-{shard_id:05d}-of-{self.num_shards:05d}"

    def location(self, key, name=None):
        """The location of the whole variable stored under `key`."""
        if key not in self.shapes:
            raise ExportError(f"the checkpoint has no variable {key!r}")
        shape = tuple(self.shapes[key])
        return VariableLocation(name or key, key, shape, (0,) * len(shape), shape,
                                tf.as_dtype(self.dtypes[key]))

    def read(self, key):
        """The whole value stored under `key` (for small variables)."""
        return self._reader.get_tensor(key)

    def read_rows(self, loc, row_start, rows):
        """Rows [row_start, row_start + rows) of `loc` as a numpy array."""
        entry = self.entries.get(loc.key)
        if (entry is not None and not entry.slices and not loc.is_partition
                and loc.dtype.is_numpy_compatible and loc.dtype != tf.string):
            row_bytes = loc.nbytes // max(loc.shape[0], 1)
            if entry.size != loc.nbytes:
                raise ExportError(
                    f"checkpoint entry {loc.key!r} holds {entry.size} bytes, "
                    f"expected {loc.nbytes} for shape {list(loc.shape)}: the "
                    f"checkpoint is corrupt")
            path = self._shard_path(entry.shard_id)
            with open(path, "rb") as f:
                f.seek(entry.offset + row_start * row_bytes)
                raw = f.read(rows * row_bytes)
            if len(raw) != rows * row_bytes:
                raise ExportError(f"checkpoint shard {path} is truncated "
                                  f"(reading {loc.key!r})")
            value = np.frombuffer(raw, loc.dtype.as_numpy_dtype)
            return value.reshape((rows,) + tuple(loc.shape[1:]))
        return tf.raw_ops.RestoreV2(
            prefix=self.prefix, tensor_names=[loc.key],
            shape_and_slices=[loc.slice_spec(row_start, rows)],
            dtypes=[loc.dtype])[0].numpy()


class StreamingBundleWriter:
    """Writes a checkpoint bundle whose tensors arrive in row chunks, each
    stored whole (`_bundle_writer.so`, over TF's table and crc32c code).

    Tensors streamed at the same time go to different data shards (e.g. a
    table's data to shard 0, its scales to shard 1); one tensor per shard is
    open at a time. Memory is one chunk, whatever the tensor size.
    """

    _library = None

    def __init__(self, prefix, num_shards):
        self.prefix = prefix
        error = ctypes.create_string_buffer(1024)
        self._handle = self._lib().tfce_bundle_open(prefix.encode(), num_shards, error,
                                                    len(error))
        if not self._handle:
            raise ExportError(f"cannot write {prefix}: {error.value.decode()}")

    @classmethod
    def _lib(cls):
        if cls._library is None:
            path = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "_bundle_writer.so")
            if not os.path.exists(path):
                raise ExportError(f"{path} is missing: build the package "
                                  f"(pip install --no-build-isolation -e .)")
            lib = ctypes.CDLL(path)  # TF's libraries are loaded already (import tf)
            err = [ctypes.c_char_p, ctypes.c_size_t]
            lib.tfce_bundle_open.restype = ctypes.c_void_p
            lib.tfce_bundle_open.argtypes = [ctypes.c_char_p, ctypes.c_int] + err
            lib.tfce_bundle_begin.argtypes = [
                ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
                ctypes.POINTER(ctypes.c_int64)] + err
            lib.tfce_bundle_append.argtypes = [ctypes.c_void_p, ctypes.c_int,
                                               ctypes.c_void_p, ctypes.c_size_t] + err
            lib.tfce_bundle_end.argtypes = [ctypes.c_void_p, ctypes.c_int] + err
            lib.tfce_bundle_finish.argtypes = [ctypes.c_void_p] + err
            cls._library = lib
        return cls._library

    def _call(self, what, function, *args):
        error = ctypes.create_string_buffer(1024)
        if function(self._handle, *args, error, len(error)):
            raise ExportError(f"writing {what} to {self.prefix}: {error.value.decode()}")

    def begin(self, shard, key, dtype, shape):
        """Starts tensor `key` of `shape` and numpy `dtype` in data shard `shard`."""
        dims = (ctypes.c_int64 * len(shape))(*shape)
        self._call(repr(key), self._lib().tfce_bundle_begin, shard, key.encode(),
                   tf.as_dtype(np.dtype(dtype)).as_datatype_enum, len(shape), dims)

    def append(self, shard, value):
        """Appends rows (a C-order array) to the open tensor of `shard`."""
        value = np.ascontiguousarray(value)
        self._call(f"shard {shard}", self._lib().tfce_bundle_append, shard,
                   value.ctypes.data_as(ctypes.c_void_p), value.nbytes)

    def end(self, shard):
        """Ends the open tensor of `shard` (all its rows must be appended)."""
        self._call(f"shard {shard}", self._lib().tfce_bundle_end, shard)

    def finish(self):
        """Writes the index; frees the writer, also when raising."""
        handle, self._handle = self._handle, None
        error = ctypes.create_string_buffer(1024)
        if self._lib().tfce_bundle_finish(handle, error, len(error)):
            raise ExportError(f"writing {self.prefix}: {error.value.decode()}")

    def abort(self):
        """Frees the writer after a failure (what it wrote is left to delete)."""
        if self._handle:
            handle, self._handle = self._handle, None
            self._lib().tfce_bundle_finish(handle, None, 0)


def save_whole(prefix, keys, values):
    """Writes whole tensors `values` under `keys` as one checkpoint."""
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=list(keys),
                      shape_and_slices=[""] * len(keys),
                      tensors=[tf.constant(v) for v in values])


def merge_checkpoints(prefixes, out_prefix):
    """Merges checkpoints into one at `out_prefix` (data files are moved, not copied)."""
    tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=list(prefixes),
                                  destination_prefix=out_prefix,
                                  delete_old_dirs=True)
