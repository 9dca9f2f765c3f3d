"""The systemd units in deploy/: hardened (systemd-analyze's offline security score), their flags
known to the binaries, and the readiness/watchdog protocol (sd_notify) they rely on, spoken by the
real tallyd and tally-worker to a datagram socket standing in for systemd."""
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import unittest

import tallytest as tt

UNITS = {"tallyd.service": "tallyd", "tally-worker@.service": "tally-worker"}
ANALYZE = shutil.which("systemd-analyze")


def unit_text(name):
    with open(os.path.join(tt.SRC, "deploy", name)) as f:
        return f.read()


class UnitTest(unittest.TestCase):
    @unittest.skipIf(ANALYZE is None, "systemd-analyze is not installed (Debian's systemd package)")
    def test_exposure_at_most_5(self):
        for name in UNITS:
            p = subprocess.run([ANALYZE, "security", "--offline=true", "--no-pager",
                                os.path.join(tt.SRC, "deploy", name)], capture_output=True, text=True)
            m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", p.stdout + p.stderr)
            self.assertIsNotNone(m, p.stdout + p.stderr)
            self.assertLessEqual(float(m.group(1)), 5.0, f"{name}:\n{p.stdout}")

    def test_notify_type_watchdog_and_flags_the_binaries_know(self):
        for name, binary in UNITS.items():
            text = unit_text(name)
            self.assertIn("Type=notify", text)
            self.assertRegex(text, r"WatchdogSec=\d+")
            exec_start = re.search(r"^ExecStart=(\S+) (.*)$", text, re.M)
            self.assertEqual(os.path.basename(exec_start.group(1)), binary)
            helptext = subprocess.run([os.path.join(tt.BIN, binary), "--helpfull"], capture_output=True,
                                      text=True).stdout
            for flag in re.findall(r"--([a-z][a-z0-9_-]*)", exec_start.group(2)):
                self.assertRegex(helptext, r"--%s\b" % flag.replace("-", "[-_]"), f"{name}: --{flag}")


class NotifyTest(unittest.TestCase):
    """tallyd and tally-worker tell a NOTIFY_SOCKET READY=1 once they serve, WATCHDOG=1 at half
    WATCHDOG_USEC while alive, and STOPPING=1 when stopped."""

    def listen(self, root, name):
        path = os.path.join(root, name)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.settimeout(0.2)
        self.addCleanup(sock.close)
        return sock, path

    @staticmethod
    def messages(sock, until, deadline):
        got = []
        while time.time() < deadline:
            try:
                got.append(sock.recv(4096).decode())
            except socket.timeout:
                pass
            if until(got):
                break
        return got

    def test_ready_watchdog_and_stopping(self):
        root = tt.tmpdir(self)
        tallyd_sock, tallyd_path = self.listen(root, "tallyd.sock")
        worker_sock, worker_path = self.listen(root, "worker.sock")
        env = dict(os.environ)
        env.update(NOTIFY_SOCKET=tallyd_path, WATCHDOG_USEC="400000")
        port_file = os.path.join(root, "port")
        tallyd = subprocess.Popen([os.path.join(tt.BIN, "tallyd"), "--listen", "127.0.0.1:0", "--port-file", port_file,
                                   "--state-dir", os.path.join(root, "state")], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(tallyd.kill)
        got = self.messages(tallyd_sock, lambda g: sum("WATCHDOG=1" in m for m in g) >= 2, time.time() + 20)
        self.assertTrue(got and got[0].startswith("READY=1\nSTATUS=serving on 127.0.0.1:0"), got)
        self.assertGreaterEqual(sum(m == "WATCHDOG=1" for m in got), 2, got)
        with open(port_file) as f:
            address = "127.0.0.1:" + f.read().strip()
        env.update(NOTIFY_SOCKET=worker_path, WATCHDOG_USEC="400000")
        worker = subprocess.Popen([os.path.join(tt.BIN, "tally-worker"), "--coordinator", address, "--threads", "1"],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(worker.kill)
        got = self.messages(worker_sock, lambda g: sum("WATCHDOG=1" in m for m in g) >= 2, time.time() + 20)
        self.assertTrue(got and got[0] == f"READY=1\nSTATUS=registered with {address}", got)
        self.assertGreaterEqual(sum(m == "WATCHDOG=1" for m in got), 2, got)
        for p, sock in ((worker, worker_sock), (tallyd, tallyd_sock)):
            p.send_signal(signal.SIGTERM)
            self.assertEqual(p.wait(timeout=60), 0)
            got = self.messages(sock, lambda g: "STOPPING=1" in g, time.time() + 5)
            self.assertIn("STOPPING=1", got)
        # A watchdog meant for another process (WATCHDOG_PID) is not this one's to feed.
        env.update(NOTIFY_SOCKET=tallyd_path, WATCHDOG_PID="1")
        other = subprocess.Popen([os.path.join(tt.BIN, "tallyd"), "--listen", "127.0.0.1:0", "--state-dir",
                                  os.path.join(root, "state2")], env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        self.addCleanup(other.kill)
        got = self.messages(tallyd_sock, lambda g: False, time.time() + 2.5)
        self.assertTrue(got and got[0].startswith("READY=1"), got)
        self.assertNotIn("WATCHDOG=1", got)


if __name__ == "__main__":
    unittest.main()
