"""A command in a pseudo-terminal, driven as a person would: wait for text, type a line, press Ctrl-C or Ctrl-D.

The child is the session leader of its own terminal (pty.fork), so Ctrl-C typed into it reaches it as SIGINT
from the terminal's line discipline, as it does for a user, not as a signal sent by the test.
"""

from __future__ import annotations

import os
import pty
import re
import select
import time


class PtySession:
    def __init__(self, argv: list[str], env: dict[str, str], cwd: str) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: run the command (never returns)
            os.chdir(cwd)
            os.execve(argv[0], argv, env)
        self.output = ""  # everything the terminal showed so far
        self.seen = 0  # how far expect() has consumed

    def expect(self, pattern: str, timeout: float = 120.0) -> str:
        """Wait until `pattern` (a regex) appears after what earlier calls consumed; returns the text up to it."""
        deadline = time.monotonic() + timeout
        while True:
            match = re.compile(pattern).search(self.output, self.seen)
            if match:
                text, self.seen = self.output[self.seen:match.end()], match.end()
                return text
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(left):
                raise AssertionError(f"{pattern!r} not shown; the terminal showed:\n{self.output[-3000:]}")

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], min(timeout, 1.0))
        if not ready:
            return True
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # the child exited and closed the terminal
            return False
        self.output += data.decode(errors="replace").replace("\r\n", "\n")
        return bool(data)

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def wait(self, timeout: float = 60.0) -> int:
        """The exit status, reading what is left on the terminal meanwhile."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                while self._read(0.1):
                    pass
                return os.waitstatus_to_exitcode(status)
            self._read(0.2)
        raise AssertionError(f"still running after {timeout} s; the terminal showed:\n{self.output[-3000:]}")

    def close(self) -> None:
        try:
            if os.waitpid(self.pid, os.WNOHANG) == (0, 0):
                os.kill(self.pid, 9)
                os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        os.close(self.fd)
