"""Test helper: a throw-away Debian ``mosquitto`` broker on a loopback port. Restartable: ``stop()`` then
``start()`` brings it back on the same port; with ``persistent`` its retained messages and durable sessions (a
client's ``clean_session=False`` subscriptions and the messages queued for it while away) survive the restart, as
a broker with ``persistence true`` does."""

from __future__ import annotations

import getpass
import subprocess
from pathlib import Path
from typing import Self

from tests.support.ports import free_port
from tests.support.processes import ChildServer
from tests.support.tls_certs import Authority

MOSQUITTO = "/usr/sbin/mosquitto"


class MosquittoServer(ChildServer):
    def __init__(self, workdir: Path, *, persistent: bool = False, password: tuple[str, str] | None = None,
                 tls: Authority | None = None, require_certificate: bool = False) -> None:
        self.workdir = workdir
        self.persistent = persistent
        self.password = password  # (user, password): anonymous clients are refused
        self.tls = tls  # TLS only, with the authority's server certificate
        self.require_certificate = require_certificate  # clients must present a certificate the authority signed
        self.port = 0

    def start(self, timeout: float = 20.0) -> Self:
        if not Path(MOSQUITTO).is_file():
            raise RuntimeError(f"{MOSQUITTO} is missing: apt-get install mosquitto (scripts/setup.sh)")
        self.port = self.port or free_port()  # a restart keeps the port, so clients can come back
        self.workdir.mkdir(parents=True, exist_ok=True)
        lines = [f"listener {self.port} 127.0.0.1", f"persistence {'true' if self.persistent else 'false'}",
                 f"persistence_location {self.workdir}/", "log_dest none",
                 # As root, mosquitto would drop to the 'mosquitto' user, who cannot read pytest's private tmp dirs.
                 f"user {getpass.getuser()}"]
        if self.tls is not None:
            lines += [f"cafile {self.tls.ca}", f"certfile {self.tls.server.cert}", f"keyfile {self.tls.server.key}",
                      f"require_certificate {'true' if self.require_certificate else 'false'}"]
        if self.password is None:
            lines.append("allow_anonymous true")
        else:
            passwords = self.workdir / "passwords"
            user, secret = self.password
            # mosquitto 2 takes only hashed passwords: mosquitto_passwd writes the file
            passwords.write_text("")
            subprocess.run(["/usr/bin/mosquitto_passwd", "-b", str(passwords), user, secret], check=True)
            lines += ["allow_anonymous false", f"password_file {passwords}"]
        config = self.workdir / "mosquitto.conf"
        config.write_text("\n".join(lines) + "\n")
        return self._spawn([MOSQUITTO, "-c", str(config)], "mosquitto", timeout, interval=0.05)
