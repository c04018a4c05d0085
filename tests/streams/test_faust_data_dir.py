"""faust makes a data folder even with the memory store: each processor's is its own and goes
when the process exits (one per run, a demo's four, piled up in the temporary folder)."""

from __future__ import annotations

import os
import subprocess
import sys


def test_a_processors_faust_folder_goes_when_the_process_exits():
    code = ("from streams.config import Settings\n"
            "from streams.faust_app import make_app\n"
            "app = make_app('detector', Settings(topic_prefix='t-dir.'), topic_replication_factor=1)\n"
            "print(app.conf.datadir, flush=True)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    path = out.stdout.strip().splitlines()[-1]
    assert os.path.basename(path).startswith("t-dir.detector."), path
    assert not os.path.exists(path), f"{path} outlived its process"
