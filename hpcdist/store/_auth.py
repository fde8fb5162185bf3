"""The TCP store's shared secret and its HMAC-SHA256 challenge-response.

Secret sources, first match wins:

1. the ``secret=`` keyword of :class:`~hpcdist.store.TCPStore`;
2. the environment variable ``HPCDIST_STORE_SECRET``;
3. the file named by ``HPCDIST_STORE_SECRET_FILE``, which must be a regular
   file owned by the current user and not readable or writable by group or
   others (mode ``0600`` or stricter).

Handshake (both sides prove they know the secret, without sending it)::

    server -> client   server_nonce (32 random bytes)
    client -> server   client_nonce, HMAC(secret, "client" | server_nonce | client_nonce)
    server -> client   HMAC(secret, "server" | server_nonce | client_nonce)

Fresh nonces on both sides defeat replay; distinct labels defeat reflection;
MACs are compared with :func:`hmac.compare_digest`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat

from ..errors import DistStoreError

__all__ = [
    "ENV_SECRET",
    "ENV_SECRET_FILE",
    "NONCE_BYTES",
    "client_proof",
    "load_secret_file",
    "new_nonce",
    "new_secret",
    "resolve_secret",
    "server_proof",
]

ENV_SECRET = "HPCDIST_STORE_SECRET"
ENV_SECRET_FILE = "HPCDIST_STORE_SECRET_FILE"
NONCE_BYTES = 32
_LABEL_CLIENT = b"hpcdist-store-v1 client\x00"
_LABEL_SERVER = b"hpcdist-store-v1 server\x00"
_MAX_SECRET_FILE = 64 * 1024


def new_secret() -> str:
    """A fresh random per-job secret (64 hex characters, 256 bits).

    Rank 0 can create one and hand it to the other ranks over a channel they
    already trust (``HPCDIST_STORE_SECRET`` in the job's environment, a 0600
    file on a shared file system, an MPI broadcast).
    """
    return secrets.token_hex(32)


def new_nonce() -> bytes:
    """Random challenge bytes for one handshake."""
    return secrets.token_bytes(NONCE_BYTES)


def _as_secret_bytes(secret: str | bytes, source: str) -> bytes:
    if isinstance(secret, str):
        value = secret.encode("utf-8")
    elif isinstance(secret, (bytes, bytearray)):
        value = bytes(secret)
    else:
        raise TypeError(f"secret must be str or bytes (from {source}), got {type(secret).__name__}")
    if not value:
        raise ValueError(f"secret from {source} is empty; give a non-empty secret (see hpcdist.store.new_secret())")
    return value


def load_secret_file(path: str) -> bytes:
    """Read a secret from ``path``; refuse a file that others could read.

    Surrounding whitespace (a trailing newline) is stripped. Raises
    :class:`~hpcdist.errors.DistStoreError` when the file is missing, not a
    regular file, not owned by the current user, readable or writable by group
    or others, or empty.
    """
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise DistStoreError(f"cannot open the store secret file {path!r} (from ${ENV_SECRET_FILE}): {exc}") from exc
    try:
        st = os.fstat(fd)  # fstat on the opened file: no check-then-open race
        if not stat.S_ISREG(st.st_mode):
            raise DistStoreError(f"store secret file {path!r} is not a regular file")
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise DistStoreError(
                f"store secret file {path!r} is owned by uid {st.st_uid}, not by the current user "
                f"(uid {os.getuid()}); refusing it"
            )
        if st.st_mode & 0o077:
            raise DistStoreError(
                f"store secret file {path!r} has mode {stat.S_IMODE(st.st_mode):04o}: group or others can "
                f"access it, so the secret is not secret; run `chmod 600 {path}` and retry"
            )
        data = os.read(fd, _MAX_SECRET_FILE + 1)
    finally:
        os.close(fd)
    if len(data) > _MAX_SECRET_FILE:
        raise DistStoreError(f"store secret file {path!r} is larger than {_MAX_SECRET_FILE} bytes")
    data = data.strip()
    if not data:
        raise DistStoreError(f"store secret file {path!r} is empty")
    return data


def resolve_secret(secret: str | bytes | None) -> bytes | None:
    """The secret to use: ``secret`` if given, else the environment, else ``None``."""
    if secret is not None:
        return _as_secret_bytes(secret, "the secret= argument")
    env = os.environ.get(ENV_SECRET)
    if env:
        return _as_secret_bytes(env, f"${ENV_SECRET}")
    path = os.environ.get(ENV_SECRET_FILE)
    if path:
        return load_secret_file(path)
    return None


def client_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """The MAC a client sends to prove it knows ``secret``."""
    return hmac.new(secret, _LABEL_CLIENT + server_nonce + client_nonce, hashlib.sha256).digest()


def server_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """The MAC a server sends back to prove it knows ``secret`` too."""
    return hmac.new(secret, _LABEL_SERVER + server_nonce + client_nonce, hashlib.sha256).digest()
