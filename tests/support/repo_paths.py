"""Where things are in the source tree, for tests that run files by path."""
import os

SUPPORT = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(SUPPORT)
ROOT = os.path.dirname(TESTS)
