"""Google Cloud names a Dataflow job is given, checked offline (one ``ValueError`` line each):
project ids, regions, ``gs://`` paths. Beam's own checks are looser, and an invalid bucket
name makes Beam try to create a default bucket over the network. Used by ``fanin run``
before a Dataflow job is built (``fanin.pipelines.dataflow_checks``) and by the presets
(``fanin.runners``).
"""

from __future__ import annotations

import re

__all__ = ["SETUP_FILE_NAMES", "match_name", "validate_dataflow_location", "validate_gcs_path"]

# the --setup_file Fanin takes: Beam builds a setup.py with `python setup.py sdist` when the
# `build` module is not installed; a pyproject.toml only with `python -m build --no-isolation`,
# which needs `build` and Fanin's build requirements (setuptools >= 68, wheel) in the launching
# environment, which a fresh installation of Fanin does not have
SETUP_FILE_NAMES = ("setup.py",)

# Google Cloud naming rules (documented limits).
_PROJECT = re.compile(r"(?:[a-z][-a-z0-9.]*[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9]")
_REGION = re.compile(r"[a-z]+-[a-z]+[0-9]+")
_ZONE = re.compile(r"[a-z]+-[a-z]+[0-9]+-[a-z]")
_BUCKET = re.compile(r"[a-z0-9][-_.a-z0-9]{1,221}[a-z0-9]")
_BUCKET_PART = re.compile(r"[a-z0-9](?:[-_a-z0-9]{0,61}[a-z0-9])?")  # between dots
_IP_ADDRESS = re.compile(r"[0-9]{1,3}(?:\.[0-9]{1,3}){3}")
_BUCKET_RULES = ("a valid bucket name (3-63 characters, or up to 222 with dots: a-z, 0-9, -, "
                 "_, .; not starting with goog, not containing google, not an IP address)")


def _valid_bucket(name: str) -> bool:
    """Cloud Storage's bucket naming rules (its documentation's)."""
    if not _BUCKET.fullmatch(name) or name.startswith("goog") or "google" in name \
            or _IP_ADDRESS.fullmatch(name):
        return False
    if "." not in name:
        return len(name) <= 63
    return all(_BUCKET_PART.fullmatch(part) for part in name.split("."))


def match_name(name: str, pattern: re.Pattern[str], value: str, expected: str) -> None:
    """Raise ``ValueError`` (``<name> must be <expected>, got <value>``) unless ``value`` is a
    string ``pattern`` matches whole."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ValueError(f"{name} must be {expected}, got {value!r}")


def validate_gcs_path(name: str, path: str, folder: bool = False) -> None:
    """Raise ``ValueError`` unless ``path`` is ``gs://BUCKET[/...]`` with a valid bucket name
    (``folder``: ``gs://BUCKET/...``, as Beam takes a temp or staging location).

    An invalid bucket name, or a location with no ``/`` after the bucket, is worse than an
    error: Beam then tries to create a default bucket over the network, also in a dry run.
    """
    if not isinstance(path, str) or not path.startswith("gs://"):
        raise ValueError(f"{name} must be a gs:// path, got {path!r}")
    bucket, slash, _ = path[5:].partition("/")
    if not _valid_bucket(bucket):
        raise ValueError(f"{name} bucket must be {_BUCKET_RULES}, got {bucket!r}")
    if folder and not slash:
        raise ValueError(f"{name} must be a folder in a bucket, gs://BUCKET/PATH, got {path!r}")


def validate_dataflow_location(project: str, region: str, temp_location: str) -> None:
    """Raise ``ValueError`` unless project, region and ``gs://`` temp_location are well formed."""
    match_name("project", _PROJECT, project, "a project id such as my-project (6-30 characters: "
                "lower-case letters, digits, hyphens; not a project number)")
    if isinstance(region, str) and _ZONE.fullmatch(region):
        raise ValueError(f"region must be a region such as us-central1, not a zone: {region!r}")
    match_name("region", _REGION, region, "a region such as us-central1")
    validate_gcs_path("temp_location", temp_location, folder=True)
