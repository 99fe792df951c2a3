"""The TensorFlow and Keras versions this package supports: the one home of
these facts.

Imports nothing, so setup.py reads it before anything is built and the shell
tools read it with a bare ``python``. Its users:

- ``setup.py`` refuses to build against a TensorFlow older than
  ``TF_OLDEST`` and warns about one newer than ``TF_NEWEST`` (untested);
- the loader refuses to load the op library into a TensorFlow older than
  ``TF_OLDEST`` (a Bazel build or ``TFCE_OPS_LIBRARY`` skip setup.py);
- the Keras layer warns on import under a Keras older than ``KERAS_OLDEST``;
- ``tools/setup.sh`` installs ``TF_NEWEST_TESTED`` and
  ``tools/test_oldest_tf.sh`` builds and tests against ``TF_OLDEST_TESTED``
  with ``KERAS_OLDEST_TESTED``, so CI covers both ends of the range;
- ``pyproject.toml``'s ``cpu`` extra states the same range (a test checks).

The private TensorFlow and Keras APIs behind these bounds are listed in
docs/compatibility.md.
"""
TF_OLDEST = (2, 16)    # the first TensorFlow with Keras 3
TF_NEWEST = (2, 21)    # the newest TensorFlow CI tests
TF_OLDEST_TESTED = "2.16.2"
TF_NEWEST_TESTED = "2.21.0"
# Keras 3.13 is the first with Model.quantize(mode, filters=...); older
# Keras 3 releases differ in the quantization and masking behaviour the
# layer's tests compare against.
KERAS_OLDEST = (3, 13)
KERAS_OLDEST_TESTED = "3.13.2"


def _release(version):
    """(major, minor) of a version string such as "2.16.2" or "2.22.0-rc1"."""
    parts = version.split(".")
    try:
        return int(parts[0]), int("".join(
            c for c in (parts[1] if len(parts) > 1 else "0")
            if c.isdigit()) or 0)
    except ValueError:
        return None


def _name(release):
    return ".".join(map(str, release))


def _older_than(version, bound):
    """Whether ``version`` is older than release ``bound``; an unparsable
    version counts as older."""
    release = _release(version)
    return release is None or release < bound


def tf_too_old(version):
    """The message refusing TensorFlow ``version``, or None if it is new
    enough."""
    if not _older_than(version, TF_OLDEST):
        return None
    return (f"TensorFlow {version} is not supported: tf_compressed_embedding "
            f"supports TensorFlow {_name(TF_OLDEST)} to {_name(TF_NEWEST)}; "
            f"install one with `pip install "
            f"'tensorflow-cpu>={_name(TF_OLDEST)},<{TF_NEWEST[0]}."
            f"{TF_NEWEST[1] + 1}'`")


def tf_untested(version):
    """The warning for a TensorFlow newer than the newest tested, or None."""
    release = _release(version)
    if release is None or release <= TF_NEWEST:
        return None
    return (f"TensorFlow {version} is newer than {_name(TF_NEWEST)}, the "
            f"newest tf_compressed_embedding is tested with; if the build or "
            f"the tests fail, install TensorFlow {TF_NEWEST_TESTED}")


def keras_too_old(version):
    """The warning for a Keras older than ``KERAS_OLDEST``, or None."""
    if not _older_than(version, KERAS_OLDEST):
        return None
    return (f"Keras {version} is older than {_name(KERAS_OLDEST)}, the oldest "
            f"the CompressedEmbedding layer is tested with (its quantization "
            f"and masking may differ); upgrade with "
            f"`pip install 'keras>={_name(KERAS_OLDEST)}'`. The ops, "
            f"CompressedTable and exported SavedModels do not use Keras.")
