"""Child-process helpers: the process name that top/ps and bench_process_cpu.py read."""
from __future__ import annotations

import subprocess
import sys


def test_set_process_name_shows_in_proc_comm():
    code = ("from radixserve.proc import set_process_name; set_process_name('rs-worker-and-more');"
            "print(open('/proc/self/comm').read().strip())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "rs-worker-and-m"  # Linux keeps 15 bytes
