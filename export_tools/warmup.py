"""`assets.extra/tf_serving_warmup_requests`: requests TF Serving replays at load.

A server without this package's ops loads a fused model without complaint and
fails only on the first request; replaying a request per signature at load
makes it fail at load instead. The file is a TFRecord of `PredictionLog`
protos (tensorflow_serving/apis/prediction_log.proto). They are encoded here
by hand, field numbers as in that proto, so the tool needs no serving package:
    PredictionLog.predict_log = 6 -> PredictLog.request = 1 ->
    PredictRequest{model_spec = 1: ModelSpec{signature_name = 3}, inputs = 2: map}
"""
import os

import tensorflow as tf

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
_LEN = 2  # wire type of length-delimited fields


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
    spec = _field(3, signature.encode())
    request = _field(1, spec)
    for name, value in sorted(inputs.items()):
        tensor = tf.make_tensor_proto(value).SerializeToString()
        request += _field(2, _field(1, name.encode()) + _field(2, tensor))
    return _field(6, _field(1, request))


def write(model_dir, feeds, signature_defs):
    """Writes one request per signature in `feeds`; returns the record count."""
    path = os.path.join(model_dir, WARMUP_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    count = 0
    with tf.io.TFRecordWriter(path) as writer:
        for signature in sorted(feeds):
            if signature in signature_defs:
                writer.write(predict_log(signature, feeds[signature]))
                count += 1
    return count
