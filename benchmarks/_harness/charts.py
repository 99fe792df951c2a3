"""Charts: matplotlib is optional for every benchmark but serving/run.py."""
import sys


def pyplot(required=False):
    """matplotlib.pyplot on the Agg backend (files only), or None with a
    note when matplotlib is not installed (raises if ``required``)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        if required:
            raise
        print("matplotlib not installed: no chart", file=sys.stderr)
        return None
    return plt


def save(fig, path, dpi):
    """Writes ``fig`` to ``path`` and frees it."""
    import matplotlib.pyplot as plt
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
