"""Shared by every test directory: the test helpers (tests/support/:
numpy references, test models, subprocess runners) are importable by name,
and TensorFlow's C++ logging is quiet."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "support"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
