"""What every patch of verl shares: the version/source guard and its error.

A patch (documented in ``patches/README.md``) applies only to the verl version it was written for and
only when the patched code's source hashes to the value recorded from that version; otherwise it is
refused with a warning, or :class:`VerlPatchError` when ``strict``.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import warnings
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

#: The verl version our patches were written for.
VERL_VERSION = "0.9.1"


class VerlPatchError(RuntimeError):
    """The installed verl is not the one this patch was written for."""


def source_sha256(obj: Callable[..., Any]) -> str:
    """sha256 of ``inspect.getsource(obj)``."""
    return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()


def refuse(message: str, strict: bool) -> bool:
    """Raise :class:`VerlPatchError` if ``strict``, else warn; returns False (the patch is not applied)."""
    if strict:
        raise VerlPatchError(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    logger.warning(message)
    return False


def installed_verl_version() -> str:
    import verl

    return getattr(verl, "__version__", "unknown")
