"""The export tool under faults it cannot catch or prevent: killed with
SIGKILL at random points (while tables are encoded and the checkpoint is
written), and a full disk. Either way SRC is unchanged and DST does not
exist; a killed export's work directory is removed by the next export."""
import os
import resource
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import export_models
from test_export import tree_digest

CLI = [sys.executable, "-m", "export_tools"]
# ~10 MiB of FP32 tables in 500-row chunks: the checkpoint write takes a
# few seconds, long enough to be killed in the middle of.
ROWS, DIM, CHUNK_ROWS = 20_000, 32, 500


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    model = export_models.build_module_lookups(
        str(tmp_path_factory.mktemp("faults") / "src"), rows=ROWS, dim=DIM)
    return model.path


def export_command(src, dst, *extra):
    return CLI + [src, dst, "--dtype", "int8", "--min-rows", "1",
                  "--chunk-rows", str(CHUNK_ROWS), "--quiet", *extra]


def workdirs(parent):
    return [n for n in os.listdir(parent) if ".tfce-" in n]


def data_shards(parent):
    """The checkpoint data files under `parent`."""
    found = []
    for root, _, files in os.walk(parent):
        found += [os.path.join(root, f) for f in files if ".data-" in f]
    return found


def shard_bytes_written_by(parent, pid):
    """Bytes of checkpoint data the export with `pid` has written so far in
    its work directory. A killed run's leftovers are not counted: the next
    export removes them while this looks, and they are not its writes."""
    total = 0
    for name in os.listdir(parent):
        if f".tfce-{pid}-" not in name:
            continue
        for shard in data_shards(os.path.join(parent, name)):
            try:
                total += os.path.getsize(shard)
            except FileNotFoundError:  # renamed or removed meanwhile
                pass
    return total


def kill_when(command, condition, timeout=300):
    """Starts `command`, SIGKILLs it as soon as `condition(pid)` holds;
    returns whether it was killed (False: it finished first)."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    try:
        while process.poll() is None and time.monotonic() < deadline:
            if condition(process.pid):
                process.send_signal(signal.SIGKILL)
                process.wait()
                return True
            time.sleep(0.01)
        return False
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_sigkill_at_random_points_leaves_src_and_no_dst(source, tmp_path):
    digest = tree_digest(source)
    dst = str(tmp_path / "dst")
    # How long an undisturbed export takes, and where its write begins.
    started = time.monotonic()
    subprocess.run(export_command(source, str(tmp_path / "reference"), "--no-verify"),
                   check=True, capture_output=True)
    duration = time.monotonic() - started

    rng = np.random.default_rng(7)
    kills = []
    # Mid-checkpoint: as soon as the data shard has some bytes, and when it
    # has grown past a random size; then at random times over the whole run.
    reference_bytes = sum(os.path.getsize(f) for f in data_shards(str(tmp_path / "reference")))
    for fraction in (0.0, *rng.uniform(0.1, 0.9, 2)):
        limit = max(fraction * reference_bytes, 1)

        def mid_write(pid, limit=limit):
            return shard_bytes_written_by(str(tmp_path), pid) >= limit
        kills.append(("checkpoint write", kill_when(export_command(source, dst), mid_write)))
    for delay in rng.uniform(0.2, 1.0, 3) * duration:
        start = time.monotonic()
        kills.append((f"after {delay:.1f} s", kill_when(
            export_command(source, dst), lambda pid, d=delay, s=start: time.monotonic() - s > d)))
        assert tree_digest(source) == digest
        assert not os.path.exists(dst), f"DST appeared after a kill {kills[-1][0]}"
    assert all(killed for where, killed in kills[:3]), kills  # the write was hit
    assert sum(killed for _, killed in kills) >= 4, kills
    assert tree_digest(source) == digest
    assert not os.path.exists(dst)
    assert workdirs(tmp_path), "a killed export leaves its work directory"

    # The next export to the same DST removes the leftovers and succeeds.
    result = subprocess.run(export_command(source, dst, "--no-verify"),
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert os.path.exists(os.path.join(dst, "saved_model.pb"))
    assert workdirs(tmp_path) == []
    assert tree_digest(source) == digest


def _mount_tmpfs(path, size):
    path.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                             str(path)], capture_output=True, text=True)
    return result.returncode == 0


def _file_size_limit(limit):
    def apply():  # in the child: writes past `limit` fail with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@pytest.fixture(scope="module")
def output_sizes(source, tmp_path_factory):
    """Sizes of a complete export: its saved_model.pb and its largest file."""
    out = str(tmp_path_factory.mktemp("sizes") / "dst")
    subprocess.run(export_command(source, out, "--no-verify"), check=True,
                   capture_output=True)
    sizes = [os.path.getsize(os.path.join(root, f))
             for root, _, files in os.walk(out) for f in files]
    return os.path.getsize(os.path.join(out, "saved_model.pb")), max(sizes), sum(sizes)


@pytest.mark.parametrize("where", ["saved_model.pb", "checkpoint"])
@pytest.mark.parametrize("limit", ["tmpfs", "file_size"])
def test_full_disk_is_a_clear_error_and_leaves_nothing(source, output_sizes, tmp_path,
                                                       where, limit):
    pb_bytes, largest, total = output_sizes
    assert largest > pb_bytes + 65536  # the checkpoint shard is the big file
    digest = tree_digest(source)
    volume = tmp_path / "volume"
    preexec = None
    if limit == "tmpfs":
        size = pb_bytes // 2 if where == "saved_model.pb" else (total + pb_bytes) // 2
        if not _mount_tmpfs(volume, size):
            pytest.skip("cannot mount a tmpfs here (not root?); the file_size "
                        "case covers the same path")
        reason = "No space left on device"
    else:
        volume.mkdir()
        preexec = _file_size_limit(pb_bytes // 2 if where == "saved_model.pb"
                                   else pb_bytes + 32768)
        reason = "File too large"
    try:
        dst = volume / "dst"
        result = subprocess.run(export_command(source, str(dst)), capture_output=True,
                                text=True, preexec_fn=preexec)
        lines = [line for line in result.stderr.splitlines()
                 if line.startswith("tfce-export:")]
        assert result.returncode == 1, result.stderr[-3000:]
        assert len(lines) == 1 and reason in lines[0], result.stderr[-3000:]
        if where == "checkpoint":
            assert "variables" in lines[0], lines  # names the file it was writing
        assert "Traceback" not in result.stderr
        assert os.listdir(volume) == [], "a partial output was left"
        assert tree_digest(source) == digest
    finally:
        if limit == "tmpfs":
            subprocess.run(["umount", str(volume)], check=False)
