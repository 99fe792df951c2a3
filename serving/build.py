"""Builds the serving harness against the installed TensorFlow.

    python serving/build.py [--out PATH] [--force]

Prints the binary's path. Skips the compile when the binary was built from
the same source, flags and TensorFlow (recorded in PATH.buildinfo).
"""
import argparse
import hashlib
import os
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = [os.path.join(HERE, "harness.cc"), os.path.join(HERE, "prediction_log.cc")]
DEFAULT_OUT = os.path.join(HERE, "harness")


def command(out):
    import tensorflow as tf

    compile_flags = tf.sysconfig.get_compile_flags()
    link_flags = tf.sysconfig.get_link_flags()
    lib_dir = next(f[2:] for f in link_flags if f.startswith("-L"))
    # The session factory and the kernels are in libtensorflow_cc, which the
    # harness references no symbol of directly: without --no-as-needed the
    # linker drops it and LoadSavedModel finds no session factory.
    # -I: the sources include each other as "serving/...", from the repo root.
    return ([os.environ.get("CXX", "g++"), "-O2", "-w", f"-I{os.path.dirname(HERE)}",
             *SOURCES, "-o", out]
            + compile_flags + link_flags
            + ["-Wl,--no-as-needed", "-l:libtensorflow_cc.so.2", "-Wl,--as-needed",
               f"-Wl,-rpath,{lib_dir}", "-ldl", "-lpthread"]), tf.__version__


def build(out=DEFAULT_OUT, force=False):
    """Compiles the harness into `out` unless it is up to date; returns `out`."""
    cmd, tf_version = command(out)
    digest = hashlib.sha256()
    for source in SOURCES + [os.path.join(HERE, "prediction_log.h")]:
        digest.update(open(source, "rb").read())
    digest.update(repr((cmd, tf_version)).encode())
    info = out + ".buildinfo"
    stamp = digest.hexdigest()
    if not force and os.path.isfile(out) and os.path.isfile(info) \
            and open(info).read().strip() == stamp:
        return out
    # Compile to a temporary name and rename, so concurrent builds (parallel
    # test workers) never see a half-written binary.
    tmp = f"{out}.tmp{os.getpid()}"
    cmd[cmd.index(out)] = tmp
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"building the serving harness failed:\n{shlex.join(cmd)}\n"
                           f"{result.stderr}")
    os.replace(tmp, out)
    with open(info, "w") as f:
        f.write(stamp + "\n")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="binary path (default: %(default)s)")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args()
    try:
        print(build(os.path.abspath(args.out), args.force))
    except RuntimeError as e:
        sys.exit(str(e))


if __name__ == "__main__":
    main()
