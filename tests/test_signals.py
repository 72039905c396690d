"""The one signal handler (loopscale/signals.py): a stop is a flag, and a repeated stop cannot kill the wind-down."""

from __future__ import annotations

import subprocess
import sys

_SCRIPT = """\
import os, signal, time
from loopscale.signals import STOP_OR_WARN, StopSignals
assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
with StopSignals() as quiet:
    pass
assert quiet.caught is None and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # no stop: restored as it was
with StopSignals(STOP_OR_WARN) as stop:
    os.kill(os.getpid(), signal.SIGTERM)
    while stop.caught is None:
        time.sleep(0.01)
assert signal.getsignal(signal.SIGINT) == signal.default_int_handler  # a second Ctrl-C still interrupts
for sig in (signal.SIGTERM, signal.SIGUSR2):  # their default would kill the process mid-wind-down
    os.kill(os.getpid(), sig)
time.sleep(0.2)
print("alive")
"""


def test_after_a_caught_stop_a_repeated_sigterm_or_usr2_is_ignored_and_ctrl_c_still_interrupts() -> None:
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "alive", (done.returncode, done.stderr[-2000:])
