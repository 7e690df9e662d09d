"""Claims: among processes that share a file system, one computes a missing result while the others wait.

    held = claims.acquire(path.with_suffix(".claim"), what="point/3f2a...", until=entry.exists)
    if held is None:        # the result appeared while we waited: read it
        ...
    else:
        with held:          # ours until the block ends; a heartbeat thread keeps it fresh meanwhile
            ...compute and write the result atomically...

A claim is a small JSON file created with ``O_CREAT | O_EXCL`` (so exactly one process creates it) that
holds the claimant's host, pid, a random token and a heartbeat timestamp, rewritten every
:data:`HEARTBEAT_S` seconds while the block runs and removed when it ends (error or not). A process that
finds someone else's claim polls until the result appears (``until()``), the claim is released, or the
claim is *stale*, which it then takes over:

- its process is dead (same host; a zombie counts as dead), or the claim is this process's own pid but not
  held by it (a previous process with a reused pid), or
- its heartbeat is older than :data:`STALE_S` seconds (any host; also an unreadable claim file).

So a worker killed mid-computation costs only what it was computing: the next process that needs the
result takes the claim over at once on the same host, after ``STALE_S`` from another one.
Waiting longer than :data:`WAIT_S` for a live claim raises :class:`ClaimTimeout`, naming the holder.

The claim only avoids computing a result twice. Correctness does not rest on it: results are written to a
temporary file and renamed, and readers check them, so even two processes that both believe they hold a
claim (a pid namespace that hides a live process, a clock far off) write whole, equal entries.

Environment: ``EARLYEXIT_CLAIM_HEARTBEAT_S`` (default 5), ``EARLYEXIT_CLAIM_STALE_S`` (default 120),
``EARLYEXIT_CLAIM_WAIT_S`` (default 21600, six hours: a live holder is working, so waiting is right).
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Callable


def _env_s(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from None
    if v <= 0:
        raise ValueError(f"{name} must be positive, got {raw!r}")
    return v


HEARTBEAT_S = 5.0
STALE_S = 120.0
WAIT_S = 6 * 3600.0
HOST = socket.gethostname()
_held: set[str] = set()  # tokens of the claims this process holds
_lock = threading.Lock()


class ClaimTimeout(TimeoutError):
    """Waited too long for a live claim; the message names its holder and the claim file."""


def settings() -> tuple[float, float, float]:
    """(heartbeat, stale, wait) in seconds: the module's defaults unless the environment sets them."""
    return (_env_s("EARLYEXIT_CLAIM_HEARTBEAT_S", HEARTBEAT_S), _env_s("EARLYEXIT_CLAIM_STALE_S", STALE_S),
            _env_s("EARLYEXIT_CLAIM_WAIT_S", WAIT_S))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):
        return False
    try:  # a killed child not yet reaped by its parent is a zombie: dead for our purpose
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def read(path: Path) -> tuple[dict | None, float | None]:
    """(the claim's content or None if unreadable, the file's mtime or None if there is no file)."""
    try:
        raw = path.read_bytes()
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        return None, None
    try:
        info = json.loads(raw)
        return (info if isinstance(info, dict) else None), mtime
    except ValueError:
        return None, mtime


def stale_reason(info: dict | None, mtime: float, stale_s: float, now: float | None = None) -> str | None:
    """Why the claim ``info`` (file modified at ``mtime``) may be taken over, or None if it is live."""
    now = time.time() if now is None else now
    if info is None:
        return f"unreadable claim untouched for {now - mtime:.0f} s" if now - mtime > stale_s else None
    if info.get("host") == HOST and isinstance(info.get("pid"), int):
        pid = info["pid"]
        if pid == os.getpid():
            with _lock:
                if info.get("token") not in _held:
                    return f"left by an earlier process with this pid ({pid})"
        elif not _pid_alive(pid):
            return f"its process {pid} on {HOST} is gone"
    beat = info.get("heartbeat")
    beat = beat if isinstance(beat, (int, float)) else mtime
    if now - beat > stale_s:
        return f"no heartbeat for {now - beat:.0f} s (limit {stale_s:.0f} s)"
    return None


def is_live(path: Path) -> bool:
    """Whether a process holds a live claim on ``path`` now (a claim file that :func:`acquire` would wait for,
    not take over)."""
    info, mtime = read(Path(path))
    return mtime is not None and stale_reason(info, mtime, settings()[1]) is None


def _describe(info: dict | None) -> str:
    if not info:
        return "an unknown process"
    return f"pid {info.get('pid')} on {info.get('host')}"


class Claim:
    """A claim this process holds; release it with :meth:`release` or by leaving its ``with`` block."""

    def __init__(self, path: Path, what: str, heartbeat_s: float):
        self.path, self.what, self.token = Path(path), what, uuid.uuid4().hex
        self.started = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, args=(heartbeat_s,), daemon=True,
                                        name=f"claim-heartbeat {what}")

    def content(self) -> bytes:
        return json.dumps({"host": HOST, "pid": os.getpid(), "token": self.token, "what": self.what,
                           "started": self.started, "heartbeat": time.time()}).encode()

    def _create(self) -> bool:
        """Create the claim file exclusively; False if another one is there."""
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with _lock:
            _held.add(self.token)
        try:
            os.write(fd, self.content())
        finally:
            os.close(fd)
        self._thread.start()
        return True

    def mine(self) -> bool:
        info, _ = read(self.path)
        return bool(info) and info.get("token") == self.token

    def _beat(self, every: float) -> None:
        while not self._stop.wait(every):
            if not self.mine():  # taken over (we looked stale) or removed: stop refreshing someone else's
                return
            tmp = self.path.with_name(f".{self.path.name}.{self.token}.beat")
            try:
                tmp.write_bytes(self.content())
                os.replace(tmp, self.path)
            except OSError:
                tmp.unlink(missing_ok=True)

    def release(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.mine():
            self.path.unlink(missing_ok=True)
        with _lock:
            _held.discard(self.token)

    def __enter__(self) -> "Claim":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _take_over(path: Path, seen: bytes) -> None:
    """Remove the stale claim file ``path`` whose content was ``seen``, unless it changed meanwhile.

    The file is renamed aside first (one process wins the rename); if what was renamed is not what was
    judged stale (it was refreshed or replaced in between), it is put back unless a newer claim exists."""
    aside = path.with_name(f".{path.name}.{uuid.uuid4().hex}.stale")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    try:
        if aside.read_bytes() != seen:
            try:
                os.link(aside, path)
            except OSError:  # a newer claim is there (or no hard links here): leave it
                pass
    finally:
        aside.unlink(missing_ok=True)


def acquire(path: Path, what: str, until: Callable[[], bool] | None = None, *, wait_s: float | None = None,
            poll_s: float = 0.05, on_wait: Callable[[str], None] | None = None) -> Claim | None:
    """Claim ``path`` for computing ``what``; return the :class:`Claim`, or None as soon as ``until()`` is
    true (the result appeared while waiting; it is checked before each attempt).

    Waits while another process holds a live claim; takes over a stale one (see the module docstring);
    raises :class:`ClaimTimeout` after ``wait_s`` seconds (default :data:`WAIT_S` or the environment).
    ``on_wait(message)`` is called once when it starts waiting for someone else's claim."""
    heartbeat_s, stale_s, default_wait = settings()
    wait_s = default_wait if wait_s is None else wait_s
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    told = False
    delay = poll_s
    while True:
        if until is not None and until():
            return None
        claim = Claim(path, what, heartbeat_s)
        if claim._create():
            return claim
        info, mtime = read(path)
        if mtime is None:  # released between our attempt and our look: try again at once
            continue
        reason = stale_reason(info, mtime, stale_s)
        if reason is not None:
            try:
                seen = path.read_bytes()
            except FileNotFoundError:
                continue
            _take_over(path, seen)
            continue
        waited = time.monotonic() - t0
        if waited > wait_s:
            beat = (info or {}).get("heartbeat")
            beat = beat if isinstance(beat, (int, float)) else mtime
            raise ClaimTimeout(
                f"{what}: waited {waited:.0f} s for the claim of {_describe(info)} (claim file {path}), which is "
                f"still alive (heartbeat {time.time() - beat:.0f} s ago). Raise "
                f"EARLYEXIT_CLAIM_WAIT_S (now {wait_s:.0f} s) to wait longer, or, if that process is really gone, "
                f"delete the claim file.")
        if not told and on_wait is not None:
            on_wait(f"{what}: waiting for {_describe(info)}, which is computing it")
            told = True
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)
