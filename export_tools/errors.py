"""The one error type the export tool raises for anything it refuses or cannot do,
and the one way TensorFlow's own errors are quoted in its messages."""
import re


class ExportError(Exception):
    """A refusal or failure of the export, with a one-line message naming the
    table, node or file at fault."""


# TF's "defined at" block: "Detected at node X defined at (most recent call
# last):", then the Python stack that built the node, indented (or "<stack
# traces unavailable>" in a loaded SavedModel).
_NODE_STACK = re.compile(r"Detected at node .*? defined at \(most recent call "
                         r"last\):\n(?:(?:[ \t].*|<stack traces unavailable>|)\n)*")


def tf_error_message(error):
    """The actionable part of a TensorFlow exception, on one line: TF's own
    message without its "Graph execution error:" header and the Python stack
    of the node that failed (the model's build code, not the user's); the
    failing node is kept."""
    text = getattr(error, "message", None) or str(error)
    text = _NODE_STACK.sub("", text)
    text = text.replace("Graph execution error:", "")
    return " ".join(line.strip() for line in text.splitlines() if line.strip())
