"""The daemon's signal handlers must not log: structlog's writer holds a non-reentrant lock while it writes a
line, and a handler runs in the main thread between two bytecodes, possibly inside that write. A SIGTERM that
arrived while a line was written hung the daemon until SIGKILL (it happened in the suite). Each case runs
in a child process, with a writer that sends the signal from inside the write, and a timeout."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import structlog
    from cdc import log as cdc_log
    from cdc.pipeline.daemon import Daemon, install_signal_handlers

    class Writer:
        '''stderr that raises SIGNAL from inside its first write, while structlog holds its lock'''
        def __init__(self):
            self.lines, self.armed = [], True
        def write(self, text):
            if self.armed:
                self.armed = False
                os.kill(os.getpid(), getattr(signal, sys.argv[1]))
                for _ in range(10_000):  # bytecodes: the handler runs among them
                    pass
            self.lines.append(text)
            return len(text)
        def flush(self):
            pass

    class Stub:
        '''the parts of Daemon the handlers use'''
        note_signal = Daemon.note_signal
        log_signals = Daemon.log_signals
        def __init__(self):
            self._signals, self.stopped, self.reload = [], False, None
        def stop(self):
            self.stopped = True
        def request_reload(self, path):
            self.reload = path

    real, writer = sys.stderr, Writer()
    sys.stderr = writer
    cdc_log.configure(fmt="json")
    daemon = Stub()
    install_signal_handlers(daemon, "cdc.yaml")
    structlog.get_logger("test").info("a_line_being_written")
    daemon.log_signals()
    print(daemon.stopped, daemon.reload, "".join(writer.lines), file=real)
    """
)


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_signal_that_arrives_while_a_line_is_written_is_acted_on_and_logged_after(name: str) -> None:
    done = subprocess.run([sys.executable, "-c", CHILD, name], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    stopped, reload, lines = done.stderr.split(" ", 2)
    assert stopped == str(name != "SIGHUP") and reload == ("cdc.yaml" if name == "SIGHUP" else "None")
    assert '"event": "a_line_being_written"' in lines and f'"signal": "{name}"' in lines, lines
