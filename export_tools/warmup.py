"""`assets.extra/tf_serving_warmup_requests`: requests TF Serving replays at load.

A server without this package's ops loads a fused model without complaint and
fails only on the first request; replaying a request per signature at load
makes it fail at load instead. The file is a TFRecord of `PredictionLog`
protos (tensorflow_serving/apis/prediction_log.proto). They are encoded and
decoded here by hand, field numbers as in that proto, so the tool needs no
serving package:
    PredictionLog.predict_log = 6 -> PredictLog.request = 1 ->
    PredictRequest{model_spec = 1: ModelSpec{signature_name = 3}, inputs = 2: map}
The same file in a source model holds real requests: verification runs on
them (see read).
"""
import os

import tensorflow as tf
from tensorflow.core.framework import tensor_pb2

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
DEFAULT_SIGNATURE = "serving_default"  # what TF Serving runs for an empty name
_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5  # protobuf wire types
_PREDICT_LOG, _REQUEST, _MODEL_SPEC, _INPUTS, _SIGNATURE_NAME = 6, 1, 1, 2, 3
_MAP_KEY, _MAP_VALUE = 1, 2


def _varint(value):
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number, payload):
    return _varint(number << 3 | _LEN) + _varint(len(payload)) + payload


def predict_log(signature, inputs):
    """A serialized PredictionLog holding one PredictRequest."""
    request = _field(_MODEL_SPEC, _field(_SIGNATURE_NAME, signature.encode()))
    for name, value in sorted(inputs.items()):
        tensor = tf.make_tensor_proto(value).SerializeToString()
        request += _field(_INPUTS, _field(_MAP_KEY, name.encode())
                          + _field(_MAP_VALUE, tensor))
    return _field(_PREDICT_LOG, _field(_REQUEST, request))


def write(model_dir, requests, signature_defs):
    """Writes `requests` ({signature: [feed, ...]}) of the signatures in
    `signature_defs`; returns the record count."""
    path = os.path.join(model_dir, WARMUP_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    count = 0
    with tf.io.TFRecordWriter(path) as writer:
        for signature in sorted(requests):
            if signature in signature_defs:
                for feed in requests[signature]:
                    writer.write(predict_log(signature, feed))
                    count += 1
    return count


def count(model_dir):
    """The number of records in `model_dir`'s warmup file."""
    path = os.path.join(model_dir, WARMUP_FILE)
    return sum(1 for _ in tf.data.TFRecordDataset(path)) if os.path.exists(path) else 0


class MalformedRecord(ValueError):
    """A record that is not a serialized PredictionLog."""


def _read_varint(data, pos):
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise MalformedRecord("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _fields(data):
    """(field number, payload) of each length-delimited field of a message;
    fields of other wire types are skipped."""
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            _, pos = _read_varint(data, pos)
        elif wire == _FIXED64:
            pos += 8
        elif wire == _FIXED32:
            pos += 4
        elif wire == _LEN:
            size, pos = _read_varint(data, pos)
            if pos + size > len(data):
                raise MalformedRecord("field runs past the record")
            yield number, data[pos:pos + size]
            pos += size
        else:
            raise MalformedRecord(f"wire type {wire}")
    if pos != len(data):
        raise MalformedRecord("truncated field")


def parse_predict_log(record):
    """(signature, {input: ndarray}) of a serialized PredictionLog holding a
    PredictRequest; None for the other log kinds (classify, regress, ...)."""
    predict_log = [p for n, p in _fields(record) if n == _PREDICT_LOG]
    if not predict_log:
        return None
    request = b"".join(p for n, p in _fields(predict_log[-1]) if n == _REQUEST)
    signature, inputs = DEFAULT_SIGNATURE, {}
    for number, payload in _fields(request):
        if number == _MODEL_SPEC:
            for n, p in _fields(payload):
                if n == _SIGNATURE_NAME and p:
                    signature = p.decode()
        elif number == _INPUTS:
            entry = dict(_fields(payload))
            try:
                tensor = tensor_pb2.TensorProto.FromString(
                    entry.get(_MAP_VALUE, b""))
                inputs[entry.get(_MAP_KEY, b"").decode()] = tf.make_ndarray(
                    tensor)
            except Exception as e:  # noqa: BLE001 - a protobuf or dtype error
                raise MalformedRecord(f"input tensor: {e}") from None
    return signature, inputs


def read(path, per_signature=None):
    """{signature: [{input: ndarray}, ...]} from the predict requests of a
    TFRecord file of PredictionLogs, in file order, the first
    `per_signature` of each signature (all if None). Raises MalformedRecord
    for a record that is not a PredictionLog; other log kinds are skipped."""
    requests = {}
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
        parsed = parse_predict_log(record)
        if parsed is None:
            continue
        kept = requests.setdefault(parsed[0], [])
        if per_signature is None or len(kept) < per_signature:
            kept.append(parsed[1])
    return requests
