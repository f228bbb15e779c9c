"""Options that a runner's job server defines, passed through ``fanin run``.

Beam's Python SDK knows its own pipeline options only. A job-server runner (``FlinkRunner``,
``SparkRunner``, ``PortableRunner``) asks its job server, when the job is submitted, which
other options it defines (``DescribePipelineOptions``: Flink's ``--checkpointing_interval``,
``--state_backend``, ``--max_bundle_size``, ...) and drops, with a logged warning only, any
option it is given that the job server does not define. Fanin passes such options through
and refuses the ones the job server does not define.

Guarantees:
- ``job_server_option_names(beam_args, unknown)``: for a job-server runner, the names of the
  options in ``unknown`` (the arguments no Beam Python option knows: ``--name``,
  ``--name=value`` or ``--name value``); ``ValueError`` (one line) for any other runner, and
  for an argument that is not of those forms.
- ``checked_runner(beam_args, names)``: the runner of ``beam_args``, whose submission raises
  ``ValueError`` naming every option of ``names`` its job server does not define, or the one
  whose value does not read as the job server's type (one line), before the job is
  submitted (nothing runs; Beam stops the job server it started when the process exits).
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Sequence
from typing import Any, cast

from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.portable_runner import JobServiceHandle, PortableRunner
from apache_beam.runners.portability.prism_runner import PrismRunner
from apache_beam.runners.runner import PipelineRunner, create_runner

from fanin.pipelines.runner_choice import runner_in

__all__ = ["checked_runner", "job_server_option_names"]

_NAME = re.compile(r"--([A-Za-z][A-Za-z0-9_]*)(=.*)?", re.DOTALL)


def _job_server_runner(runner: str | None) -> type[PortableRunner] | None:
    """The runner class of ``runner`` when it takes options from a job server, else None.
    (Prism is left out: it passes any option on without checking it.)"""
    if runner is None:
        return None
    try:
        cls = type(create_runner(runner))
    except (ValueError, ImportError, AttributeError):
        return None
    if issubclass(cls, PortableRunner) and not issubclass(cls, PrismRunner):
        return cls
    return None


def job_server_option_names(beam_args: Sequence[str], unknown: Sequence[str]) -> list[str]:
    """The option names in ``unknown`` (see the module docstring), in order."""
    runner = runner_in(beam_args)
    if _job_server_runner(runner) is None:
        raise ValueError(f"unrecognized arguments: {' '.join(unknown)}")
    names: list[str] = []
    takes_value = False  # the previous argument was a bare ``--name``
    for arg in unknown:
        match = _NAME.fullmatch(arg)
        if match is not None:
            names.append(match.group(1))
            takes_value = match.group(2) is None
        elif takes_value and not arg.startswith("-"):
            takes_value = False
        else:
            raise ValueError(f"unrecognized argument for {runner}: {arg}")
    return names


class _CheckedHandle(JobServiceHandle):
    """A job service handle that refuses options its job server does not define."""

    def __init__(self, handle: JobServiceHandle, runner: str, names: Sequence[str]) -> None:
        super().__init__(  # type: ignore[no-untyped-call]
            handle.job_service, handle.options, handle._retain_unknown_options)
        self._runner = runner
        self._names = tuple(names)

    def get_pipeline_options(self) -> Any:
        """Beam's options for the job, once every passed-through option is among them and
        reads as its job server's type (Beam's parser printed its whole usage and exited)."""
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said):
                options = super().get_pipeline_options()
        except SystemExit:
            why = next((line.split(": error: ", 1)[1] for line in said.getvalue().splitlines()
                        if ": error: " in line), "an option it cannot read")
            raise ValueError(f"the {self._runner} job server's options: {why}") from None
        missing = [f"--{name}" for name in self._names
                   if f"beam:option:{name}:v1" not in options.fields]
        if missing:
            raise ValueError(f"the {self._runner} job server defines no option "
                             f"{', '.join(missing)}")
        return options


def checked_runner(beam_args: Sequence[str], names: Sequence[str]) -> PipelineRunner:
    """The runner of ``beam_args`` (a job-server runner) checking ``names`` at submission."""
    runner = runner_in(beam_args)
    cls = _job_server_runner(runner)
    if runner is None or cls is None:
        raise ValueError(f"{runner} does not take options from a job server")
    checked = tuple(names)

    def create_job_service_handle(self: PortableRunner, job_service: Any,
                                  options: PipelineOptions) -> JobServiceHandle:
        handle = cls.create_job_service_handle(self, job_service, options)
        return _CheckedHandle(handle, runner, checked)

    subclass = type(cls.__name__, (cls,),
                    {"create_job_service_handle": create_job_service_handle})
    return cast(PipelineRunner, subclass())
