"""pipeline.atomic: a write either lands whole or leaves nothing, and its I/O errors name the
path (a full disk as "No space left on device")."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from codepost.pipeline.atomic import (
    WriteError,
    append_line,
    remove_stale_staging,
    staged,
    write_json,
    write_text,
)
from codepost.pipeline.run_lock import RunFolderLocked, run_folder_lock

KILLED_MID_PUBLISH = """
import os, signal, sys
from pathlib import Path
from codepost.pipeline.atomic import staged
with staged(Path(sys.argv[1]), folder=True) as staging:
    (staging / "model.safetensors").write_bytes(b"x" * 1000)
    print(staging, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)  # as a stopped run: no finally runs
"""


def _killed_mid_publish(target):
    done = subprocess.run([sys.executable, "-c", KILLED_MID_PUBLISH, str(target)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == -signal.SIGTERM, done.stderr
    return Path(done.stdout.strip())


def test_an_exception_inside_staged_leaves_no_file_and_the_old_one_as_it_was(tmp_path):
    target = write_text(tmp_path / "a.txt", "old")
    with pytest.raises(ValueError, match="halfway"), staged(target) as staging:
        staging.write_text("half")
        raise ValueError("halfway")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_a_failed_folder_leaves_nothing_and_a_leftover_folder_is_replaced(tmp_path):
    target = tmp_path / "ckpt"
    with pytest.raises(RuntimeError), staged(target, folder=True) as staging:
        (staging / "weights").write_bytes(b"x")
        raise RuntimeError
    assert not list(tmp_path.iterdir())
    (target / "stale").mkdir(parents=True)
    with staged(target, folder=True) as staging:
        (staging / "weights").write_bytes(b"y")
    assert [p.name for p in target.iterdir()] == ["weights"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_reader_sees_the_old_file_or_the_new_one_never_a_part(tmp_path):
    """Readers race a writer replacing a 1 MiB file: every read is one whole version."""
    target = tmp_path / "data.json"
    versions = [str(i) * (1 << 20) for i in range(10)]
    write_text(target, versions[0])
    seen, done = set(), threading.Event()

    def read() -> None:
        while not done.is_set():
            seen.add(target.read_text())

    reader = threading.Thread(target=read)
    reader.start()
    for version in versions[1:]:
        write_text(target, version)
    done.set()
    reader.join()
    assert seen <= set(versions) and target.read_text() == versions[-1]


def test_write_json_is_sorted_and_ends_with_a_newline(tmp_path):
    target = write_json(tmp_path / "sub" / "x.json", {"b": 1, "a": [2]})
    assert target.read_text() == '{\n  "a": [\n    2\n  ],\n  "b": 1\n}\n'


def test_append_line_adds_whole_lines(tmp_path):
    log = tmp_path / "metrics.jsonl"
    append_line(log, '{"step": 1}')
    append_line(log, '{"step": 2}\n')  # one newline, whether the line has it or not
    assert log.read_text() == '{"step": 1}\n{"step": 2}\n'


def test_append_line_names_the_path_it_could_not_write(tmp_path):
    with pytest.raises(WriteError) as caught:
        append_line(tmp_path / "no-such-folder" / "metrics.jsonl", "x")
    assert caught.value.errno == errno.ENOENT
    assert str(tmp_path / "no-such-folder" / "metrics.jsonl") in str(caught.value)


def test_a_full_disk_is_named_with_the_path(full_disk):
    target = full_disk / "big.bin"
    with pytest.raises(WriteError) as caught, staged(target) as staging:
        staging.write_bytes(os.urandom(2 << 20))
    assert caught.value.errno == errno.ENOSPC and isinstance(caught.value, OSError)
    assert f"No space left on device (writing {target})" in str(caught.value)
    assert not list(full_disk.iterdir())


def test_what_a_killed_writer_was_staging_goes_with_the_next_write_or_run(tmp_path):
    checkpoints = tmp_path / "run" / "rl" / "checkpoints"
    leftover = _killed_mid_publish(checkpoints / "iteration-0003")
    older = checkpoints / ".iteration-0002.tmp-k2j4h5l6"  # an older version's name: no owner
    older.mkdir()
    assert leftover.is_dir() and leftover.name.startswith(".iteration-0003.tmp-")
    with staged(checkpoints / "iteration-0003", folder=True) as staging:  # the resumed publish
        assert not leftover.exists()
        (staging / "model.safetensors").write_bytes(b"y")
        other = _killed_mid_publish(checkpoints / "iteration-0004")
        with run_folder_lock(tmp_path / "run"):  # the next run: a live writer's stays
            assert staging.is_dir() and not other.exists() and not older.exists()
    assert sorted(p.name for p in checkpoints.iterdir()) == ["iteration-0003"]
    assert remove_stale_staging(tmp_path) == []


def test_a_lock_that_cannot_be_taken_is_named(tmp_path):
    (tmp_path / ".lock").mkdir()
    with (
        pytest.raises(RunFolderLocked, match=r"lock .*\.lock: Is a directory"),
        run_folder_lock(tmp_path),
    ):
        pass
