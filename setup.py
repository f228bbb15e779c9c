"""Stub so Dataflow workers can install Fanin with ``--setup_file ./setup.py``.

``pyproject.toml`` is the single source of truth for metadata and dependencies;
setuptools reads it from there.
"""

from setuptools import setup

setup()
