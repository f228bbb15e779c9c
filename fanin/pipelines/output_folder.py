"""The local output folder of a run: checked, locked and prepared before anything is written.

Guarantees: every refusal is one ``ConfigError`` line and deletes nothing
(``check_output_early`` needs nothing written; ``locked_output`` checks again holding the
folder's lock); ``--overwrite`` empties the three output folders only after every check
passed, and never a folder holding a file the run reads.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Callable, Sequence

from fanin.core.outcomes import CLOSES, DEAD_LETTER, LATE
from fanin.io.output_lock import MARK, OutputLock, check_not_busy
from fanin.pipelines.config import ConfigError, RunConfig
from fanin.transforms.read import expand_inputs

__all__ = ["absent_folders", "check_output_early", "enclosing_output", "files_in",
           "locked_output", "remove_empty"]


def _prepare_output(output: str, overwrite: bool, kept: Sequence[tuple[str, str]] = (),
                    continues: bool = False, on_replace: Callable[[], None] | None = None
                    ) -> None:
    """Create the three folders; refuse to mix with an earlier run's files unless asked
    (``--overwrite`` deletes them), except for a run that ``continues`` earlier ones (a
    subscription's next run: its files, named with its own job token, join theirs, whose
    messages were acknowledged and cannot be read again); refuse (``ConfigError``) a path that
    is a file where a folder must be, any folder that cannot be created or written in, or
    ``--overwrite`` of a folder that holds one of the files the run reads, ``kept`` as
    ``(option, path)`` (its inputs, its contracts file: it would delete them before reading
    them) or that this user cannot empty (a folder in it not writable, or an entry the
    system does not let it delete: ``_empty``): nothing is deleted then. ``on_replace`` is
    called once, before the first deletion."""
    folders = _output_folders(output)
    for folder in folders:
        for option, path in kept:
            if "://" not in path and _within(os.path.realpath(path), folder):
                raise ConfigError(f"{option} {path} is in {folder}, which this run replaces "
                                  "with its outputs; move it out first")
    replaced = _checked_folders(output, folders, overwrite, continues)
    if replaced:
        _empty(replaced, on_replace)
    for folder in folders:
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as exc:  # e.g. a read-only file system
            raise ConfigError(f"--output: cannot create {folder}: {exc.strerror or exc}"
                              ) from None
        if not _writable(folder):  # created, but not for us to write in (umask)
            raise ConfigError(f"--output: cannot write in {folder}: {_not_writable(folder)}")


def _within(real: str, folder: str) -> bool:
    """The real path ``real`` is ``folder`` or inside it (links resolved)."""
    found = os.path.realpath(folder)
    return os.path.commonpath([found, real]) == found


def _empty(folders: Sequence[str], on_replace: Callable[[], None] | None) -> None:
    """Empty the output ``folders`` of an earlier run, all or nothing: each entry is first
    moved into a hidden folder of its output folder (or of the file system mounted inside it
    that holds the entry), files and links first, then folders, the deepest first: the
    system allows such a move exactly when it allows the deletion, also for a file another
    user owns in a folder with the sticky bit, or one made immutable; only when all have
    moved is ``on_replace`` called and the hidden folders deleted. A move refused moves
    every entry back and raises ``ConfigError`` naming it: nothing is deleted then. The
    output folders themselves stay (one that is a symbolic link keeps its link and its
    target, emptied, as ``--output`` itself may be a link), and so does a folder another
    file system is mounted on, emptied."""
    try:
        entries = [entry for folder in folders for entry in _entries(folder)]
    except OSError as exc:  # a folder in it this user cannot list
        raise ConfigError(f"--overwrite: cannot list {exc.filename}: {exc.strerror or exc}; "
                          "nothing was deleted") from None
    moved: list[tuple[str, str]] = []
    hidden: dict[str, str] = {}  # where a hidden folder is -> the hidden folder
    what = ""
    try:
        for path, root in entries:
            trash = hidden.get(root)
            if trash is None:
                what = f"the files in {root}"
                trash = os.path.join(root, f".fanin-replaced-{uuid.uuid4().hex}")
                os.mkdir(trash, 0o700)
                hidden[root] = trash
            what = path
            target = os.path.join(trash, str(len(moved)))
            os.rename(path, target)
            moved.append((path, target))
    except OSError as exc:
        kept = _move_back(moved, list(hidden.values()))
        raise ConfigError(f"--overwrite: cannot delete {what}: {exc.strerror or exc}"
                          f"{kept}; nothing was deleted") from None
    if on_replace is not None:
        on_replace()
    for trash in hidden.values():
        try:
            shutil.rmtree(trash)
        except OSError as exc:
            raise ConfigError(f"--overwrite: cannot delete {exc.filename or trash}: "
                              f"{exc.strerror or exc}") from None


def _entries(folder: str) -> list[tuple[str, str]]:
    """Every entry under ``folder`` with the folder its hidden folder goes in (``folder``, or
    the folder a file system inside it is mounted on: a move cannot leave a file system):
    files, links and the like first, then folders (not followed if links), each after the
    folders inside it; a folder a file system is mounted on is not listed (it cannot move),
    what it holds is."""
    files: list[tuple[str, str]] = []
    folders: list[tuple[str, str]] = []

    def walk(where: str, root: str, device: int) -> None:
        with os.scandir(where) as scanned:
            entries = sorted(scanned, key=lambda entry: entry.name)
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                files.append((entry.path, root))
                continue
            mounted = entry.stat(follow_symlinks=False).st_dev
            if mounted != device:  # another file system: emptied, where it is
                walk(entry.path, entry.path, mounted)
            else:
                walk(entry.path, root, device)
                folders.append((entry.path, root))

    walk(folder, folder, os.stat(folder).st_dev)
    return files + folders


def _move_back(moved: list[tuple[str, str]], hidden: list[str]) -> str:
    """Undo ``_empty``'s moves, the last first; ``""``, or where entries that could not be
    moved back are (in words, for the refusal's line)."""
    stuck: set[str] = set()
    for path, target in reversed(moved):
        try:
            os.rename(target, path)
        except OSError:
            stuck.add(os.path.dirname(target))
    for trash in hidden:
        if trash not in stuck:
            with contextlib.suppress(OSError):
                os.rmdir(trash)
    return f" (earlier outputs that could not be put back are in {', '.join(sorted(stuck))})" \
        if stuck else ""


def _not_a_file(path: str) -> None:
    """``ConfigError`` when ``path`` exists and is not a folder."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"--output: {path} is a file, not a folder")


def _no_dangling_link(folder: str) -> None:
    """``ConfigError`` when ``folder`` is a symbolic link to nothing (or a loop of links):
    no folder can be created there."""
    if os.path.islink(folder) and not os.path.exists(folder):
        raise ConfigError(f"--output: {folder} is a symbolic link to nothing "
                          f"({os.readlink(folder)})")


def _checked_folders(output: str, folders: list[str], overwrite: bool, continues: bool
                     ) -> list[str]:
    """The output ``folders`` this run deletes first (``_prepare_output``), after every check
    passed: a refusal (``ConfigError``) deletes nothing."""
    replaced = []
    for folder in folders:
        for path in (output, folder):
            _not_a_file(path)
        _no_dangling_link(folder)
        if os.path.isdir(folder) and os.listdir(folder) and (overwrite or not continues):
            if not overwrite:
                raise ConfigError(_holds_something(output, folder))
            for parent, _, _ in os.walk(folder):  # deleting a file needs its folder writable
                if not _writable(parent):
                    raise ConfigError(f"--overwrite: cannot delete the files in {parent}: "
                                      f"{_not_writable(parent)}")
            replaced.append(folder)
        elif os.path.isdir(folder) and not _writable(folder):
            raise ConfigError(f"--output: cannot write in {folder}: {_not_writable(folder)}")
    return replaced


def _holds_something(output: str, folder: str) -> str:
    """Why ``output`` is refused without ``--overwrite``: its output ``folder`` holds outputs,
    or only other files (named: ``--overwrite`` would delete them too)."""
    kind = os.path.basename(folder)
    names = sorted(os.listdir(folder))
    if any(_a_runs(kind, name) or name.startswith(".") for name in names):  # .: a run's
        return f"{output} already holds outputs; pass --overwrite to replace them"  # temporary
    return (f"{folder} holds files that are not outputs of fanin run ({names[0]}"
            f"{f' and {len(names) - 1} more' if len(names) > 1 else ''}), which --overwrite "
            "would delete: move them out of it")


def check_output_early(config: RunConfig) -> None:
    """The refusals of a local output folder that need nothing written (``_checked_folders``,
    and a file in its path), so that a refused run says one line and nothing else; the lock
    (``locked_output``) checks again, holding the folder."""
    check_not_busy(config.output)
    enclosing = enclosing_output(config.output)
    if enclosing is not None:
        raise ConfigError(f"--output {config.output} is in {enclosing}, an output folder of "
                          "an earlier run: fanin query would read its files as that run's, and "
                          "its --overwrite delete them; give a folder outside it")
    ancestor = os.path.abspath(config.output)
    while not os.path.exists(ancestor) and os.path.dirname(ancestor) != ancestor:
        ancestor = os.path.dirname(ancestor)
    _not_a_file(ancestor)
    _checked_folders(config.output, _output_folders(config.output), config.overwrite,
                     config.reads_pubsub)


def enclosing_output(path: str, output: str | None = None) -> str | None:
    """The output folder (``closes/``, ``late/`` or ``dead_letter/``) that holds ``path`` (or
    is it): one of ``output``'s, or of a folder holding a run's outputs (its files, or the
    mark of a run); else None. A file or a run's outputs put there would be read by ``fanin
    query`` as that folder's, and deleted by its ``--overwrite``."""
    if "://" in path:  # a bucket's folder: no local folder holds it
        return None
    real = os.path.realpath(path)
    if output is not None and "://" not in output:
        for folder in _output_folders(output):
            if _within(real, folder):
                return folder
    ancestor = real
    while os.path.dirname(ancestor) != ancestor:
        parent = os.path.dirname(ancestor)
        if os.path.basename(ancestor) in (CLOSES, LATE, DEAD_LETTER) and _holds_outputs(parent):
            return ancestor
        ancestor = parent
    return None


def _holds_outputs(folder: str) -> bool:
    """``folder`` holds a run's outputs: a file of ``fanin run``'s naming in one of its
    output folders, or the mark a run leaves (``MARK``)."""
    if os.path.lexists(os.path.join(folder, MARK)):
        return True
    for kind in (CLOSES, LATE, DEAD_LETTER):
        try:
            names = os.listdir(os.path.join(folder, kind))
        except OSError:  # absent, or not a folder
            continue
        if any(_a_runs(kind, name) for name in names):
            return True
    return False


def _a_runs(kind: str, name: str) -> bool:
    """``name``, in output folder ``kind``, is one ``fanin run`` gives its files there
    (``<kind>-...``; a closes Parquet file's ``close_date=...`` folder)."""
    return name.startswith((f"{kind}-", "close_date="))


def _output_folders(output: str) -> list[str]:
    """The three output folders of ``output``."""
    return [os.path.join(output, kind) for kind in (CLOSES, LATE, DEAD_LETTER)]


def absent_folders(output: str) -> tuple[str, ...]:
    """The output folders of ``output`` that do not exist (yet), then ``output`` itself if it
    does not (so that ``remove_empty`` removes the folders inside it first)."""
    return tuple(folder for folder in [*_output_folders(output), output]
                 if not os.path.isdir(folder))


def remove_empty(folders: Sequence[str]) -> None:
    """Remove each of ``folders`` that exists and is empty (a run that wrote nothing leaves
    no empty output folders, which readers would take for a finished run's)."""
    for folder in folders:
        try:
            os.rmdir(folder)
        except OSError:  # gone already, or holding something
            continue


def _writable(folder: str) -> bool:
    """This process may create and delete files in ``folder``."""
    return os.access(folder, os.W_OK | os.X_OK)


def _not_writable(folder: str) -> str:
    """Why ``folder`` is not ``_writable``, in words."""
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return "read-only file system"
    except OSError:
        pass
    return "permission denied"


def files_in(output: str) -> frozenset[str]:
    """Every file in the output folders of ``output`` (temporary ones too)."""
    return frozenset(os.path.join(root, name) for folder in _output_folders(output)
                     for root, _, names in os.walk(folder) for name in names)


def locked_output(config: RunConfig, made: Sequence[str] = ()) -> OutputLock:
    """Lock the local output folder for this run (``OutputLock``), then prepare it
    (``_prepare_output``): a run refused there leaves the folder as it was, less ``made``
    (``absent_folders`` before the lock: the folders it made) if they are empty; a run
    refused because another holds the folder touches nothing."""
    _not_a_file(config.output)
    _no_dangling_link(config.output)
    continues = config.reads_pubsub
    try:
        lock = OutputLock.acquire(config.output, continues, config.overwrite)
    except OSError as exc:  # e.g. a read-only file system, a folder not ours
        raise ConfigError(f"--output: cannot create or lock {config.output}: "
                          f"{exc.strerror or exc}") from None
    try:
        read = [("--input", path) for path in
                (expand_inputs(config.inputs) if config.inputs else ())]
        if config.contracts_path is not None:
            read.append(("--contracts", config.contracts_path))
        _prepare_output(config.output, config.overwrite, read, continues=continues,
                        on_replace=lock.mark_changed)
    except BaseException:
        if lock.changed:
            lock.release()  # it deleted earlier outputs: not the folder it found
        else:
            remove_empty(made)  # the output folders it made (the mark keeps the folder)
            lock.abandon()
            remove_empty(made[-1:])  # the folder too if it made it (and no other run since)
        raise
    return lock
