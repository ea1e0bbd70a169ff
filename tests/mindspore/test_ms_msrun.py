"""``msrun`` (MindSpore's launcher): a script that only calls ``init_device_mesh("CPU",
(2,))`` joins msrun's world (``mindspore.communication.init()`` in the 2 workers and in
msrun's scheduler process, which runs the script too) and computes a sharded matmul equal
to numpy's. Run in a subprocess; the pytest process does not import MindSpore."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.mindspore, pytest.mark.multiproc]

SCRIPT = Path(__file__).with_name("_msrun_script.py")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_msrun_two_workers(tmp_path):
    bindir = Path(sys.executable).parent
    msrun = shutil.which("msrun", path=str(bindir)) or shutil.which("msrun")
    if msrun is None:
        pytest.skip("msrun (installed with MindSpore) is not on PATH")
    env = dict(os.environ)
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"  # msrun starts `python`
    env["PYTHONPATH"] = os.pathsep.join([str(SCRIPT.parents[2]), env.get("PYTHONPATH", "")])
    env.setdefault("GLOG_v", "3")
    logs = tmp_path / "logs"
    cmd = [
        msrun, "--worker_num=2", "--local_worker_num=2", "--master_addr=127.0.0.1",
        f"--master_port={_port()}", f"--log_dir={logs}", "--join=True",
        "--cluster_time_out=150", str(SCRIPT),
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=200)
    text = "".join(p.read_text(errors="replace") for p in sorted(logs.glob("worker_*.log")))
    lines = sorted(re.findall(r"MSRUN_RESULT .*", text))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + text[-3000:]
    assert len(lines) == 2, text[-3000:]
    for rank, line in enumerate(lines):
        assert f"rank={rank} world=2 group=mccl_world_group" in line
        assert "placements=(Shard(dim=0),)" in line and line.endswith("ok=True")
