"""Exception hierarchy: one root, each subclass also a matching built-in (Opacus style).

Messages say what is wrong, the value received, what is allowed and what to do next.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "DataUnavailableError",
    "DataFormatError",
    "FedUnlearnError",
    "HistoryCorruptError",
    "HistoryError",
    "ForgottenDataError",
    "IntegrityError",
    "MalformedFrameError",
    "OutputError",
    "PeerAuthenticationError",
    "PeerDisconnectedError",
    "PluginError",
    "SecureComputationError",
    "SessionMismatchError",
    "UnknownClientError",
    "UnknownMethodError",
    "UnknownNameError",
    "UnknownPolicyError",
    "UnsupportedHistoryError",
]


class FedUnlearnError(Exception):
    """Root of every error this library raises on purpose."""


class ConfigError(FedUnlearnError, ValueError):
    """A configuration value is invalid (wrong type, out of range, inconsistent)."""


class IntegrityError(ConfigError):
    """A document fedunlearn wrote was changed since, or belongs to another run.

    Its integrity digest (``fedunlearn.history.digest``) fails; bad input, nothing was changed.
    """


class UnknownNameError(FedUnlearnError, KeyError):
    """A registry lookup (dataset, model, aggregator, attack, method) failed."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class UnknownClientError(FedUnlearnError, KeyError):
    """A client id is not part of the federation."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class DataUnavailableError(FedUnlearnError, FileNotFoundError):
    """Dataset files are missing and could not be downloaded."""


class DataFormatError(FedUnlearnError, ValueError):
    """A dataset file exists but is not in the expected format (or fails its checksum)."""


class HistoryError(FedUnlearnError, RuntimeError):
    """The history store cannot do what was asked (missing round, locked, wrong run)."""


class HistoryCorruptError(HistoryError):
    """A history file is corrupted or truncated; nothing was changed."""


class ForgottenDataError(HistoryError, LookupError):
    """The requested payload was removed by ``forget()`` and cannot be read."""


class OutputError(FedUnlearnError, OSError):
    """An output path cannot be written (checked before any work is done)."""

    def __str__(self) -> str:  # OSError formats (errno, strerror) pairs; keep the message
        return str(self.args[0]) if self.args else ""


class UnknownMethodError(UnknownNameError):
    """No unlearning method is registered under that name."""


class UnknownPolicyError(UnknownNameError):
    """No recording policy is registered under that name."""


class PluginError(FedUnlearnError, ImportError):
    """An installed plugin's declaration or one of its ``module:attr`` paths cannot be loaded."""


class UnsupportedHistoryError(FedUnlearnError, ValueError):
    """The run did not record the history an unlearning method needs."""


class PeerDisconnectedError(FedUnlearnError, ConnectionError):
    """The other 2PC party closed the connection or stopped answering within the timeout."""


class MalformedFrameError(FedUnlearnError, ValueError):
    """A 2PC message frame is malformed or larger than the allowed maximum; it was rejected."""


class SecureComputationError(FedUnlearnError, ArithmeticError):
    """A 2PC protocol cannot produce a result (value out of fixed-point range, singular input)."""


class PeerAuthenticationError(FedUnlearnError, PermissionError):
    """A peer failed TLS verification or its certificate's role is not allowed on this link."""


class SessionMismatchError(FedUnlearnError, ValueError):
    """Two authenticated peers run different sessions or jobs (their handshakes differ).

    Attributes:
        differences: Field name -> (ours, theirs) for every field that differs.
    """

    def __init__(self, message: str, differences: dict[str, tuple[object, object]] | None = None):
        super().__init__(message)
        self.differences = dict(differences or {})
