"""Key-value stores with torch's ``Store`` API.

- :class:`HashStore`: in-process, thread-safe.
- :class:`FileStore`: a file shared by processes (``flock``-locked log).
- :class:`TCPStore`: a server in the master process, authenticated clients.
- :class:`PrefixStore`: a key namespace inside another store.

:func:`new_secret` makes a per-job secret for the TCP store. Importing this
package starts nothing.
"""

from __future__ import annotations

from ._auth import new_secret
from .base import Store
from .file import FileStore
from .hash import HashStore
from .prefix import PrefixStore
from .tcp import TCPStore

__all__ = [
    "FileStore",
    "HashStore",
    "PrefixStore",
    "Store",
    "TCPStore",
    "new_secret",
]
