"""Google credentials, checked before anything reaches a Google service (no Apache Beam here:
``fanin query``/``fanin report`` use it too).

Guarantee: ``require_google_credentials(what, service)`` returns when Application Default
Credentials are found, and otherwise raises ``ValueError`` in one line naming ``what`` (the
option that needs them) and ``service``: Beam and the Cloud clients would retry their first
call for minutes, with tracebacks, before failing.
"""

from __future__ import annotations

__all__ = ["require_google_credentials"]


def require_google_credentials(what: str, service: str) -> None:
    """See the module docstring."""
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        google.auth.default()
    except DefaultCredentialsError:
        raise ValueError(f"{what}: no Google credentials to reach {service}: set up "
                         "Application Default Credentials (gcloud auth application-default "
                         "login, or GOOGLE_APPLICATION_CREDENTIALS)") from None
