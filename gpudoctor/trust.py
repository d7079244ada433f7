"""Which run directories this user's gpudoctor made: trust recorded where a run is made, never read
from the run.

A run directory is data from anywhere (a colleague's run, a bug report's attachment, a CI artifact),
and ``gpudoctor verify`` runs the script its manifest names. So when ``profile`` writes a run's
manifest, it records a keyed hash of the manifest's exact bytes (HMAC-SHA256 with a per-user secret)
in this user's state folder, outside the run directory. A run is
*trusted* when a record matches its manifest's bytes now: a manifest edited since, or written by another
user's gpudoctor or on another machine, has none (nobody without the secret can make one), and ``verify``
asks before it runs anything. A copy of a trusted run (moved, archived) stays trusted: its manifest
names the same folder, script and script hash, so its trials run what the original's would.

The state folder: ``$GPUDOCTOR_STATE_DIR``, else ``$XDG_STATE_HOME/gpudoctor``, else
``~/.local/state/gpudoctor`` (made with mode 0700): ``secret-key`` (32 random bytes, mode 0600, made on
first use) and ``trusted-runs/<hex HMAC of a manifest>`` (one small file a run, holding the path the run
was made at, for a person reading the folder). Deleting the folder forgets every record (the next ``profile`` makes a new secret). Stdlib only: ``collect`` records,
``verify`` checks.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

STATE_ENV = "GPUDOCTOR_STATE_DIR"
KEY_NAME = "secret-key"
RECORDS = "trusted-runs"
KEY_BYTES = 32
_DOMAIN = b"gpudoctor run trust v1\0"
MANIFEST = "manifest.json"  # model.layout.MANIFEST (not imported: this module stays stdlib only)


def state_dir() -> Path:
    """This user's gpudoctor state folder (see the module docstring); not created here."""
    env = os.environ.get(STATE_ENV)
    if env:
        return Path(os.path.abspath(os.path.expanduser(env)))
    xdg = os.environ.get("XDG_STATE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "gpudoctor"
    home = os.path.expanduser("~")
    if not os.path.isabs(home):
        raise OSError(f"cannot tell this user's home folder (HOME is not set): set {STATE_ENV}")
    return Path(home) / ".local" / "state" / "gpudoctor"


def _private(path: Path, dir_ok: bool) -> bool:
    """``path`` is this user's and nobody else may write it (nor read it, for the key)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    kind_ok = stat.S_ISDIR(st.st_mode) if dir_ok else stat.S_ISREG(st.st_mode)
    others = stat.S_IWGRP | stat.S_IWOTH | (0 if dir_ok else stat.S_IRGRP | stat.S_IROTH)
    return kind_ok and st.st_uid == os.geteuid() and not st.st_mode & others


def _read_key(d: Path) -> bytes | None:
    """The secret, when it exists and is private (a key others can read or replace proves nothing)."""
    key = d / KEY_NAME
    if not (_private(d, dir_ok=True) and _private(key, dir_ok=False)):
        return None
    try:
        data = key.read_bytes()
    except OSError:
        return None
    return data if len(data) == KEY_BYTES else None


def _key(create: bool) -> bytes | None:
    """The per-user secret; made on first use when ``create`` (raises ``OSError`` when it cannot be)."""
    d = state_dir()
    got = _read_key(d)
    if got is not None or not create:
        return got
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = d / f".{KEY_NAME}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        os.write(fd, secrets.token_bytes(KEY_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, d / KEY_NAME)  # never replaces a key another gpudoctor made meanwhile
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    got = _read_key(d)
    if got is None:
        raise OSError(f"{d} or its {KEY_NAME} can be read or written by others (or is not a folder of this user's)")
    return got


def _mac(key: bytes, manifest_bytes: bytes) -> str:
    return hmac.new(key, _DOMAIN + manifest_bytes, hashlib.sha256).hexdigest()


def record(run_dir: Path) -> Path:
    """Record that this user's gpudoctor wrote ``run_dir``'s manifest as it is now (its exact bytes, read
    back); returns the record. Raises ``OSError`` when the state folder cannot be written."""
    real = os.path.realpath(run_dir)
    data = Path(real, MANIFEST).read_bytes()
    key = _key(create=True)
    assert key is not None
    path = state_dir() / RECORDS / _mac(key, data)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(os.fsencode(real) + b"\n")  # where it was made: for a person reading the folder
    os.replace(tmp, path)
    return path


UNRECORDED = "no record that this user's gpudoctor wrote its manifest as it is (a run from elsewhere or another user, or edited)"


def check(run_dir: Path, manifest_bytes: bytes) -> str:
    """"" when this user's gpudoctor recorded a manifest of exactly ``manifest_bytes``; else why not.
    ``run_dir`` is only named: nothing is read from the run directory here, and nothing is created."""
    try:
        key = _key(create=False)
        if key is None:
            return UNRECORDED
        return "" if (state_dir() / RECORDS / _mac(key, manifest_bytes)).is_file() else UNRECORDED
    except OSError:
        return UNRECORDED


def trusted(run_dir: Path, manifest_bytes: bytes) -> bool:
    """``check`` passes: this user's gpudoctor wrote ``run_dir``'s manifest as ``manifest_bytes``."""
    return not check(run_dir, manifest_bytes)
