"""Real inputs to verify on: the user's ``--examples`` file, or the source
model's own warmup requests; each checked against the signature it feeds and
cast to its dtypes where that is lossless.

``--examples`` takes either
- an ``.npz`` with keys ``SIGNATURE/INPUT`` (string inputs as numpy ``str`` /
  ``bytes`` arrays, or object arrays of them), or
- a TFRecord file of TF Serving ``PredictionLog`` predict requests, the
  format of ``assets.extra/tf_serving_warmup_requests`` (the first
  ``REQUESTS_PER_SIGNATURE`` requests of each signature are used).

Examples are ``{signature: [feed, ...]}``, a feed being ``{input: array}``
(one request: a batch).
"""
import zipfile

import numpy as np
import tensorflow as tf

from export_tools import warmup
from export_tools.errors import ExportError

REQUESTS_PER_SIGNATURE = 16


def load_examples(path):
    """{signature: [{input: ndarray}, ...]} from an examples file (see the
    module)."""
    try:
        if zipfile.is_zipfile(path):
            return _load_npz(path)
        return _load_prediction_logs(path)
    except OSError as e:
        raise ExportError(f"cannot read examples {path}: {e}") from None


def _load_npz(path):
    feeds = {}
    with np.load(path, allow_pickle=False) as data:
        keys = data.files
    for key in keys:
        sig, _, name = key.rpartition("/")
        if not sig or not name:
            raise ExportError(f"examples {path}: key {key!r} is not "
                              f"'SIGNATURE/INPUT'")
        feeds.setdefault(sig, {})[name] = _npz_array(path, key)
    return {sig: [feed] for sig, feed in feeds.items()}


def _npz_array(path, key):
    with np.load(path, allow_pickle=False) as data:
        try:
            return data[key]
        except ValueError:  # an object array: numpy stores those pickled
            pass
    # The user's own file, named on the command line: as trusted as the
    # model it comes with. Only arrays of strings are accepted from it.
    with np.load(path, allow_pickle=True) as data:
        value = data[key]
    if not all(isinstance(v, (str, bytes)) for v in value.reshape(-1)):
        raise ExportError(
            f"examples {path}: {key!r} is an object array holding other than "
            f"str or bytes; store numbers as numeric arrays")
    return value


def _load_prediction_logs(path):
    try:
        feeds = warmup.read(path, REQUESTS_PER_SIGNATURE)
    except (warmup.MalformedRecord, tf.errors.DataLossError) as e:
        raise ExportError(
            f"examples {path} is neither an .npz file nor a TFRecord file of "
            f"TF Serving PredictionLogs ({e})") from None
    if not feeds:
        raise ExportError(f"examples {path} holds no PredictionLog predict "
                          f"requests (classify / regress logs are not used)")
    return feeds


def source_requests(src):
    """The predict requests in ``src``'s own warmup file ({} if it has none),
    as load_examples gives them."""
    path = f"{src}/{warmup.WARMUP_FILE}"
    if not tf.io.gfile.exists(path):
        return {}
    try:
        return warmup.read(path, REQUESTS_PER_SIGNATURE)
    except (warmup.MalformedRecord, tf.errors.DataLossError) as e:
        raise ExportError(
            f"{path} is not a TFRecord of PredictionLogs ({e}): TF Serving "
            f"would fail to warm up with it too; fix or remove it, or pass "
            f"--examples FILE") from None


def as_requests(examples):
    """``examples`` with each signature's value a list of feeds; a single
    feed (a dict, as the library call also takes) becomes a list of one."""
    return {sig: [value] if isinstance(value, dict) else list(value)
            for sig, value in examples.items()}


def conform(feed, signature, names, specs, origin):
    """``feed`` checked against one signature's inputs (``names``, ``specs``)
    and cast to their dtypes where no value changes; ExportError naming the
    input and what it wants otherwise. ``origin`` says where the feed came
    from, for the messages."""
    missing = sorted(set(names) - set(feed))
    unknown = sorted(set(feed) - set(names))
    if missing or unknown:
        raise ExportError(
            f"{origin}: signature {signature!r} "
            + (f"needs inputs {missing} it does not give" if missing else "")
            + ("; " if missing and unknown else "")
            + (f"has no inputs {unknown}" if unknown else "")
            + f" (its inputs: {list(names)})")
    return {name: _conform_value(np.asarray(feed[name]), spec,
                                 f"{origin}: signature {signature!r} input "
                                 f"{name!r}")
            for name, spec in zip(names, specs)}


def _conform_value(value, spec, where):
    if not spec.shape.is_compatible_with(value.shape):
        raise ExportError(f"{where} has shape {list(value.shape)}; the "
                          f"signature wants {spec.shape}")
    want = spec.dtype
    if want == tf.string:
        if value.dtype.kind in "USO":
            return value
        raise ExportError(f"{where} is {value.dtype}; the signature wants "
                          f"strings")
    if value.dtype.kind in "USO":
        raise ExportError(f"{where} holds strings; the signature wants "
                          f"{want.name}")
    target = want.as_numpy_dtype
    if value.dtype == target:
        return value
    with np.errstate(all="ignore"):
        cast = value.astype(target)
        lossless = np.array_equal(cast.astype(value.dtype), value,
                                  equal_nan=value.dtype.kind in "fc")
    if not lossless:
        raise ExportError(
            f"{where} is {value.dtype} and its values do not all fit "
            f"{want.name}, the dtype the signature wants: store them as "
            f"{want.name}")
    return cast
