"""``fanin setup prism|flink|all``: build the portable runners from the package registries.

Guarantees:
- Nothing is downloaded from anywhere but the Go module proxy (Prism), Maven Central (the Flink
  job server's jars) and PyPI (a Flink distribution); nothing of Beam's is kept in this
  repository: every artifact is built here, at set-up time, into Beam's own caches.
- Idempotent: a step whose result is already in place (and checks out) is skipped; each step
  prints one line saying what it did or found.
- Prism: ``go install github.com/apache/beam/sdks/v2/go/cmd/prism@v<installed Beam>`` is placed
  where Beam looks for its downloaded release (``~/.apache_beam/cache/prism/bin/``, the zip and
  the unpacked binary under the release's name), so ``--runner PrismRunner`` and the Prism path
  of ``--runner DirectRunner`` use it with no flag, as for an online user.
- Flink: Beam publishes no job-server jar that Maven Central serves here for 2.77 (nor 2.76,
  2.75); the newest Beam Flink runner whose whole dependency tree it serves is
  ``beam-runners-flink-1.19:2.62.0`` (docs/runners.md has the exact refusals). The job server
  is built from it the way Beam builds its own (one shaded jar, service files merged, main class
  ``FlinkJobServerDriver``) and named for what it is: ``beam-runners-flink-1.19-job-server-
  2.62.0.jar`` in Beam's jar cache. ``fanin run --runner FlinkRunner`` passes it as
  ``--flink_job_server_jar`` when the user gives none (``with_local_job_server``).
- The Flink distribution for a real cluster (``bin/``, ``lib/``) comes from the PyPI wheels
  ``apache-flink`` + ``apache-flink-libraries`` (1.19.3, the job server's Flink line), installed
  ``--no-deps`` into their own folder (``apache-flink`` pins an old Beam).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from typing import Any

from fanin.runners.reported_failures import (
    OS_ERRORS,
    UNREADABLE,
    step_file_error,
    worker_unreadable,
)

__all__ = ["FLINK_DIST_VERSION", "FLINK_JOB_SERVER_BEAM_VERSION", "add_subcommand",
           "flink_home", "flink_job_server_jar", "prism_binary", "runner_failure",
           "runner_setup_error",
           "setup_flink", "setup_prism", "with_local_job_server"]

CACHE = os.path.expanduser("~/.apache_beam/cache")
PRISM_MODULE = "github.com/apache/beam/sdks/v2/go/cmd/prism"
FLINK_LINE = "1.19"
FLINK_JOB_SERVER_BEAM_VERSION = "2.62.0"
FLINK_DIST_VERSION = "1.19.3"
SLF4J_VERSION = "1.7.30"  # the slf4j-api of beam-runners-flink-1.19:2.62.0

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>fanin.setup</groupId><artifactId>flink-job-server</artifactId><version>1</version>
  <dependencies>
    <dependency>
      <groupId>org.apache.beam</groupId><artifactId>beam-runners-flink-{line}</artifactId>
      <version>{beam}</version>
      <exclusions><exclusion>
        <groupId>commons-logging</groupId><artifactId>commons-logging</artifactId>
      </exclusion></exclusions>
    </dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>jcl-over-slf4j</artifactId>
      <version>{slf4j}</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-simple</artifactId>
      <version>{slf4j}</version></dependency>
  </dependencies>
  <build><plugins><plugin>
    <groupId>org.apache.maven.plugins</groupId><artifactId>maven-shade-plugin</artifactId>
    <version>3.5.3</version>
    <executions><execution><phase>package</phase><goals><goal>shade</goal></goals>
      <configuration>
        <finalName>{name}</finalName>
        <filters><filter><artifact>*:*</artifact><excludes>
          <exclude>META-INF/*.SF</exclude><exclude>META-INF/*.DSA</exclude>
          <exclude>META-INF/*.RSA</exclude>
        </excludes></filter></filters>
        <transformers>
          <transformer implementation=
            "org.apache.maven.plugins.shade.resource.ServicesResourceTransformer"/>
          <transformer implementation=
            "org.apache.maven.plugins.shade.resource.AppendingTransformer">
            <resource>reference.conf</resource></transformer>
          <transformer implementation=
            "org.apache.maven.plugins.shade.resource.ManifestResourceTransformer">
            <mainClass>org.apache.beam.runners.flink.FlinkJobServerDriver</mainClass>
          </transformer>
        </transformers>
      </configuration>
    </execution></executions>
  </plugin></plugins></build>
</project>
"""


class SetupError(RuntimeError):
    """A set-up step failed; the message names the command and its last output line."""


def _beam_version() -> str:
    from apache_beam.version import __version__

    return __version__


def _check(cmd: Sequence[str], **kwargs: Any) -> str:
    if shutil.which(cmd[0]) is None:
        raise SetupError(f"{cmd[0]} is not installed (needed by: {' '.join(cmd)})")
    done = subprocess.run(list(cmd), capture_output=True, text=True, check=False,  # noqa: S603
                          **kwargs)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()
        raise SetupError(f"{' '.join(cmd)} failed ({done.returncode}): "
                         f"{tail[-1] if tail else 'no output'}")
    return done.stdout


def prism_binary() -> str:
    """Where Beam looks for the unpacked Prism release of the installed Beam version."""
    from apache_beam.runners.portability.prism_runner import PrismJobServer

    version = "v" + _beam_version()
    url = PrismJobServer._construct_download_url(version, version, platform.system(),
                                                 platform.machine())
    return os.path.join(PrismJobServer.BIN_CACHE,
                        os.path.splitext(os.path.basename(url))[0])


def _built_version(binary: str) -> str | None:
    """The module version ``go version -m`` reports for ``binary`` (None if unreadable)."""
    if not os.path.isfile(binary) or shutil.which("go") is None:
        return None
    done = subprocess.run(["go", "version", "-m", binary], capture_output=True, text=True,  # noqa: S603, S607
                          check=False)
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "mod" and parts[1] == "github.com/apache/beam/sdks/v2":
            return parts[2]
    return None


def setup_prism(say: Callable[[str], None] = print) -> str:
    """Build Prism at the installed Beam's version into Beam's cache; returns the binary."""
    version = "v" + _beam_version()
    binary = prism_binary()
    archive = binary + ".zip"
    if _built_version(binary) == version and zipfile.is_zipfile(archive):
        say(f"prism {version}: already set up ({binary})")
        return binary
    os.makedirs(os.path.dirname(binary), exist_ok=True)
    with tempfile.TemporaryDirectory() as gobin:
        _check(["go", "install", f"{PRISM_MODULE}@{version}"],
               env={**os.environ, "GOBIN": gobin})
        shutil.move(os.path.join(gobin, "prism"), binary + ".tmp")
    os.chmod(binary + ".tmp", 0o755)  # noqa: S103 (an executable for this user)
    os.replace(binary + ".tmp", binary)
    # Beam checks for the release zip first, then uses the unpacked binary beside it.
    with zipfile.ZipFile(archive + ".tmp", "w", zipfile.ZIP_DEFLATED) as packed:
        packed.write(binary, os.path.basename(binary))
    os.replace(archive + ".tmp", archive)
    say(f"prism {version}: built with go install {PRISM_MODULE}@{version} -> {binary} "
        f"(+ {os.path.basename(archive)})")
    return binary


def flink_job_server_jar() -> str:
    """The job server jar ``setup_flink`` builds, in Beam's jar cache."""
    from apache_beam.utils.subprocess_server import JavaJarServer

    return os.path.join(JavaJarServer.JAR_CACHE, f"beam-runners-flink-{FLINK_LINE}-job-server-"
                                                 f"{FLINK_JOB_SERVER_BEAM_VERSION}.jar")


def flink_home() -> str:
    """The Flink distribution (``bin/``, ``lib/``, ``conf/``) ``setup_flink`` installs."""
    return os.path.join(CACHE, f"flink-{FLINK_DIST_VERSION}", "pyflink")


def _is_job_server(jar: str) -> bool:
    try:
        with zipfile.ZipFile(jar) as packed:
            manifest = packed.read("META-INF/MANIFEST.MF").decode()
            return "FlinkJobServerDriver" in manifest and \
                "org/apache/beam/runners/flink/FlinkJobServerDriver.class" in packed.namelist()
    except (OSError, KeyError, zipfile.BadZipFile):
        return False


def setup_flink(say: Callable[[str], None] = print) -> tuple[str, str]:
    """Build the Flink job server jar and install a Flink distribution; returns both paths."""
    jar = flink_job_server_jar()
    if _is_job_server(jar):
        say(f"flink job server: already set up ({jar})")
    else:
        os.makedirs(os.path.dirname(jar), exist_ok=True)
        name = os.path.splitext(os.path.basename(jar))[0]
        with tempfile.TemporaryDirectory() as build:
            with open(os.path.join(build, "pom.xml"), "w", encoding="utf-8") as pom:
                pom.write(_POM.format(line=FLINK_LINE, beam=FLINK_JOB_SERVER_BEAM_VERSION,
                                      slf4j=SLF4J_VERSION, name=name))
            _check(["mvn", "-B", "-q", "package"], cwd=build)
            shutil.move(os.path.join(build, "target", name + ".jar"), jar + ".tmp")
        os.replace(jar + ".tmp", jar)
        say(f"flink job server: built beam-runners-flink-{FLINK_LINE}:"
            f"{FLINK_JOB_SERVER_BEAM_VERSION} (Maven Central) into {jar}")
    home = flink_home()
    if os.path.isfile(os.path.join(home, "bin", "jobmanager.sh")) and \
            os.path.isfile(os.path.join(home, "lib", f"flink-dist-{FLINK_DIST_VERSION}.jar")):
        say(f"flink {FLINK_DIST_VERSION} distribution: already set up ({home})")
    else:
        target = os.path.dirname(home)
        shutil.rmtree(target, ignore_errors=True)
        _check([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target,
                f"apache-flink=={FLINK_DIST_VERSION}",
                f"apache-flink-libraries=={FLINK_DIST_VERSION}"])
        say(f"flink {FLINK_DIST_VERSION} distribution: installed apache-flink + "
            f"apache-flink-libraries (PyPI, --no-deps) into {target}")
    return jar, home


def with_local_job_server(beam_args: Sequence[str]) -> list[str]:
    """``beam_args`` plus ``--flink_job_server_jar`` for ``FlinkRunner`` when none is given and
    ``fanin setup flink`` built one (Beam would otherwise download its own, which the registries
    here do not serve)."""
    args = list(beam_args)
    if _runner_of(args) != "FlinkRunner" or "--flink_job_server_jar" in " ".join(args):
        return args
    jar = flink_job_server_jar()
    return [*args, f"--flink_job_server_jar={jar}"] if os.path.isfile(jar) else args


def check_job_endpoint(beam_args: Sequence[str]) -> None:
    """A ``--job_endpoint`` HOST:PORT that refuses connections is bad use, said at once
    (``ValueError``): Beam would wait ``--job_server_timeout`` (300 s) without a word. So is
    one that is not HOST:PORT (``garbage``: the same wait), except ``embed`` and the targets
    of other schemes (``unix:...``, ``dns:///...``), which are left to Beam, as is a HOST:PORT
    that does not answer within 5 s."""
    from apache_beam.options.pipeline_options import PipelineOptions, PortableOptions

    endpoint = PipelineOptions(list(beam_args)).view_as(PortableOptions).job_endpoint
    if endpoint is None or endpoint == "embed" or "/" in endpoint or \
            endpoint.startswith("unix:"):
        return
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--job_endpoint {endpoint}: give the job service as HOST:PORT "
                         "(e.g. localhost:8099)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except (ConnectionRefusedError, socket.gaierror) as exc:
        raise ValueError(f"--job_endpoint {endpoint}: no job service there "
                         f"({exc.strerror or exc})") from None
    except OSError:  # slow or filtered: Beam's wait decides
        return


def _runner_of(beam_args: Sequence[str]) -> str | None:
    from fanin.pipelines.runner_choice import runner_in  # Beam's, imported only when run

    return runner_in(beam_args)


# How Beam says that what a runner starts (a job server's jar for FlinkRunner and SparkRunner,
# Prism's binary) is neither given as a local file nor in its cache, and could not be
# downloaded; and what sets it up here, by runner
_UNAVAILABLE = ("Unable to fetch remote job server jar", "Unable to fetch remote prism binary")
_SETS_UP = {"FlinkRunner": "fanin setup flink", "PrismRunner": "fanin setup prism"}


def runner_setup_error(exc: BaseException, beam_args: Sequence[str]) -> str | None:
    """One line for the user when ``exc`` is Beam failing to fetch what its runner starts (a
    job server's jar, Prism's binary; nothing ran), naming the ``fanin setup`` that builds it;
    None for any other error."""
    message = str(exc)
    if not isinstance(exc, RuntimeError) or not message.startswith(_UNAVAILABLE):
        return None
    line = message.splitlines()[0]
    setup = _SETS_UP.get(_runner_of(beam_args) or "")
    return f"{line} (`{setup}` sets it up, and fanin run then uses it)" if setup else line


def runner_failure(exc: BaseException, beam_args: Sequence[str]) -> tuple[str, int] | None:
    """One line and an exit code for a failure of the runner rather than of Fanin: what the
    runner starts is not set up (``runner_setup_error``; 2), its job service does not answer
    (2), an input a worker could not read to its end (2, its one line, as the local runner
    gives it: ``fanin.io.inputs.UnreadableInput``), or the runner failed the job (1, the
    runner's first line of why; its log above has the rest). None for any other error: its
    traceback is Fanin's to show."""
    import grpc
    from apache_beam.options.pipeline_options import PipelineOptions, PortableOptions

    setup = runner_setup_error(exc, beam_args)
    if setup is not None:
        return setup, 2
    if isinstance(exc, grpc.FutureTimeoutError):
        portable = PipelineOptions(list(beam_args)).view_as(PortableOptions)
        where = f" at {portable.job_endpoint}" if portable.job_endpoint else ""
        return (f"no job service answered{where} within {portable.job_server_timeout} s "
                "(--job_endpoint, --job_server_timeout)", 2)
    failed = re.match(r"Pipeline \S+ failed in state (\w+): (.*)", str(exc), re.DOTALL)
    if isinstance(exc, RuntimeError) and failed:
        unreadable = UNREADABLE.search(failed.group(2))
        if unreadable:  # an input read by a worker (Prism's, Flink's): as on the local runner
            return unreadable.group(1).strip(), 2
        step = step_file_error(failed.group(2))
        if step is not None:  # a step's OSError in a worker (Prism's): as on the local runner
            return f"the job failed reading or writing files: {step}", 1
        why = next((line.strip() for line in failed.group(2).splitlines() if line.strip()),
                   "(no reason given)")
        return f"the runner failed the job ({failed.group(1)}): {why}", 1
    if isinstance(exc, RuntimeError):  # a worker's traceback, as the local runner relays it
        read_error = worker_unreadable(str(exc))  # from its workers (--direct_num_workers 2)
        if read_error is not None:
            return read_error, 2
        step = step_file_error(str(exc))
        if step is not None:
            return f"the job failed reading or writing files: {step}", 1
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    # an OSError of a step, as the local runner re-raises it: "... [while running 'STEP']",
    # an OSError again when its message is text, else "OSError: ..." in a RuntimeError
    if "[while running '" in first and (isinstance(exc, OSError) or (
            isinstance(exc, RuntimeError) and first.split(":", 1)[0] in OS_ERRORS)):
        return f"the job failed reading or writing files: {first}", 1
    return None


def _setup(args: argparse.Namespace) -> int:
    try:
        if args.what in ("prism", "all"):
            setup_prism()
        if args.what in ("flink", "all"):
            setup_flink()
    except SetupError as exc:
        print(f"fanin: error: {exc}", file=sys.stderr)
        return 1
    return 0


def add_subcommand(subparsers: Any) -> None:
    """Register ``setup`` on an ``argparse`` subparsers object."""
    parser = subparsers.add_parser(
        "setup", help="build Prism / the Flink job server from the package registries",
        description="Build the portable runners into Beam's caches (idempotent): Prism from "
                    "the Go module proxy, the Flink job server from Maven Central, a Flink "
                    "distribution from PyPI.")
    parser.add_argument("what", choices=("prism", "flink", "all"))
    parser.set_defaults(func=_setup)
