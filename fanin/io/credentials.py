"""Google credentials, checked before anything reaches a Google service (no Apache Beam here:
``fanin query``/``fanin report`` use it too).

Guarantee: ``require_google_credentials(what, service)`` returns when Application Default
Credentials are found, and otherwise raises ``ValueError`` in one line naming ``what`` (the
option that needs them) and ``service``: Beam and the Cloud clients would retry their first
call for minutes, with tracebacks, before failing. ``GOOGLE_APPLICATION_CREDENTIALS`` naming
a file that cannot be read (a folder, no permission) is such a line too, naming the variable
(``unreadable_credentials``; Google's libraries raise the ``OSError`` of the read).
"""

from __future__ import annotations

import os

__all__ = ["require_google_credentials", "unreadable_credentials"]


def unreadable_credentials(error: OSError) -> ValueError:
    """The one-line error of credentials Google's libraries could not read (``error``)."""
    path = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    where = f"GOOGLE_APPLICATION_CREDENTIALS={path}" if path else "the Google credentials file"
    return ValueError(f"{where}: cannot read it: {error.strerror or error}")


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
    except OSError as error:
        raise unreadable_credentials(error) from None
