"""The zygote's warm-up of a rank's first checkpoint read and write: no thread, no CUDA (not even asked for, so
forked children can use it), nothing left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

PROBE = """
import json, os, sys, threading, warnings
warnings.simplefilter("error")  # DCP's warning that it runs without a process group must not reach the zygote's stderr
import torch
from nbtrain.rank import warmup
if os.environ.get("NO_FOLDER"):  # a temporary directory nothing can be made in
    import tempfile
    def refused(*args, **kwargs):
        raise PermissionError("no room")
    tempfile.mkdtemp = refused
warmup.warm_checkpoint_paths()
child_r, child_w = os.pipe()
if os.fork() == 0:  # a child as the zygote forks one: CUDA must be its to initialise
    os.write(child_w, b"1" if torch.cuda._is_in_bad_fork() else b"0")
    os._exit(0)
os.wait()
print(json.dumps({"threads": threading.active_count(), "cuda": torch.cuda.is_initialized(),
                  "bad_fork": os.read(child_r, 1) == b"1",
                  "layouts": len(torch.serialization._get_layout.cache), "left": os.listdir(os.environ["TMPDIR"])}))
"""


def _probe(tmpdir: str, **more: str) -> tuple[dict, str]:
    env = {**os.environ, **more, "TMPDIR": tmpdir, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=100,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_the_warm_up_reads_a_checkpoint_without_a_thread_cuda_or_a_file_left(tmp_path):
    found, stderr = _probe(str(tmp_path))
    assert found["threads"] == 1, "the zygote forks: a thread left running would be lost in every rank"
    assert found["cuda"] is False
    assert found["bad_fork"] is False, "a forked rank could not use CUDA: something asked the CUDA runtime"
    assert found["layouts"] > 0, "DCP's layout was read: torch's table of tensor layouts is built"
    assert found["left"] == [], "its checkpoint folder is removed"
    assert "Warning" not in stderr


def test_a_temporary_directory_that_cannot_be_written_skips_the_warm_up_and_nothing_fails(tmp_path):
    found, stderr = _probe(str(tmp_path), NO_FOLDER="1")
    assert found["threads"] == 1 and found["layouts"] == 0, "the DCP part is skipped, and the zygote goes on"
    assert found["left"] == [] and "Error" not in stderr
