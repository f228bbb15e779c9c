"""Runner presets and the offline dry run.

``presets``: functions returning Beam command-line options for ``fanin run`` (local, Dataflow,
Flink, Spark, portable). ``dry_run``: build and check a job without running it or reaching the
network. See ``docs/runners.md``.
"""

from fanin.runners.dry_run import (
    DryRunError,
    DryRunReport,
    dry_run,
    maybe_dry_run,
    stable_names,
)
from fanin.runners.presets import dataflow, default_sdk_image, direct, flink, portable, spark

__all__ = [
    "DryRunError",
    "DryRunReport",
    "dataflow",
    "default_sdk_image",
    "direct",
    "dry_run",
    "flink",
    "maybe_dry_run",
    "portable",
    "spark",
    "stable_names",
]
