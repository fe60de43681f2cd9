"""Stopping a server process the way Kubernetes does, and timing it: shared by the
deploy scripts that start one (soak.py, probe-shutdown.py)."""

import signal
import subprocess
import time


def terminate_and_time(proc: subprocess.Popen, timeout: float = 60):
    """Sends SIGTERM and waits up to `timeout` seconds for the exit, then SIGKILL.

    Returns (exit code, or "killed after N s"; seconds from the signal to the exit)."""
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = f"killed after {timeout:g} s"
    return code, time.monotonic() - sent
