"""Checkpoint errors: every one names the checkpoint, the key and what to do."""

from __future__ import annotations

from ..errors import DistError

__all__ = ["CheckpointError", "ChecksumError", "StructureError"]


class CheckpointError(DistError):
    """A save or load failed; the message names the path, the key and the fix."""


class ChecksumError(CheckpointError):
    """Data read back does not match the checksum written with it (file and key named)."""


class StructureError(CheckpointError, ValueError):
    """The state passed to load() does not match the checkpoint's keys, shapes or dtypes."""
