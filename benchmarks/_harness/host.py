"""What a result was measured on: the CPU and the commit."""
import os
import platform
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def cpu_model():
    """The CPU's model name with its family and model numbers: the machines
    these benchmarks run on change between runs (AMD and Intel so far)."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if ":" in line:
                    k, v = line.split(":", 1)
                    info.setdefault(k.strip(), v.strip())
    except OSError:
        pass
    name = info.get("model name") or platform.processor() or "unknown"
    if "cpu family" in info and "model" in info:
        name += f" (family {info['cpu family']} model {info['model']})"
    return name


def machine():
    """"<CPU model>, <n> CPUs", as the reports print it."""
    return f"{cpu_model()}, {os.cpu_count()} CPUs"


def machine_fields():
    """The machine as CSV columns."""
    return {"cpu_model": cpu_model(), "cores": os.cpu_count()}


def commit(watched=("kernels", "tf_compressed_embedding")):
    """HEAD's short hash, marked when the `watched` folders (what the
    numbers depend on) have uncommitted changes; "unknown" without git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                              cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--",
                                *watched],
                               cwd=ROOT, capture_output=True, text=True,
                               timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + (" (kernels/ or package modified)" if dirty else "")
