"""The one error type the export tool raises for anything it refuses or cannot do."""


class ExportError(Exception):
    """A refusal or failure of the export, with a one-line message naming the
    table, node or file at fault."""
