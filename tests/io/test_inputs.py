"""Input files read the way ``fanin run --input`` and ``fanin publish`` read them
(``fanin.io.inputs``): compressed files by their suffix, and a clear error for one that cannot
be decompressed."""

from __future__ import annotations

import base64
import bz2
import gzip
import lzma
import os
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard

from fanin.io.inputs import UnreadableInput, check_start, input_lines

CONTENT = b'{"a":1}\r\n\n{"b":2}\nlast line without an ending'
COMPRESSORS: dict[str, Callable[[bytes], bytes]] = {
    ".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress,
    ".lzma": lambda data: lzma.compress(data, format=lzma.FORMAT_ALONE),
    ".deflate": zlib.compress, ".zst": zstandard.ZstdCompressor().compress,
    ".zstd": zstandard.ZstdCompressor().compress}


def read(path: Path) -> list[bytes]:
    with input_lines(str(path)) as lines:
        return list(lines)


@pytest.mark.parametrize("suffix", sorted(COMPRESSORS))
def test_a_compressed_file_reads_as_its_content(tmp_path: Path, suffix: str) -> None:
    plain = tmp_path / "in.jsonl"
    plain.write_bytes(CONTENT)
    packed = tmp_path / f"in.jsonl{suffix.upper() if suffix == '.gz' else suffix}"
    packed.write_bytes(COMPRESSORS[suffix](CONTENT))
    assert read(packed) == read(plain) == CONTENT.splitlines(keepends=True)
    check_start(str(packed))  # raises nothing


def test_a_file_not_of_its_suffixs_format_is_refused_at_its_start(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl.gz"
    path.write_bytes(CONTENT)
    message = f"input {path} cannot be decompressed at its start (zlib.error: "
    with pytest.raises(UnreadableInput) as refused:
        check_start(str(path))
    assert str(refused.value).startswith(message)
    with pytest.raises(UnreadableInput, match="at its start"):
        read(path)


def test_damage_part_of_the_way_names_the_last_line_read(tmp_path: Path) -> None:
    random = os.urandom(18 << 20)
    lines = [base64.b64encode(random[i:i + 768]) + b"\n" for i in range(0, len(random), 768)]
    data = bytearray(gzip.compress(b"".join(lines), compresslevel=1))
    assert len(data) > 17 << 20
    data[-(1 << 20):-(1 << 20) + 64] = bytes(64)  # zeros a MiB before the stream's end
    path = tmp_path / "in.jsonl.gz"
    path.write_bytes(bytes(data))
    check_start(str(path))  # the start is fine
    read_before: list[bytes] = []
    with pytest.raises(UnreadableInput, match=r"cannot be decompressed after line \d+ \(") as err, \
            input_lines(str(path)) as stream:
        read_before.extend(stream)
    assert f"after line {len(read_before)} (" in str(err.value)
    # the lines before the damage as written (the checksum at the stream's end may be what
    # tells: the damaged lines before it are read as they decompress)
    before = len(lines) - 2_000  # a MiB of compressed data is ~1,360 of them
    assert read_before[:before] == lines[:before] and len(read_before) >= before


def test_damage_part_of_the_way_stops_fanin_run_in_one_line(tmp_path: Path) -> None:
    """The read fails in the worker; Beam's log of it (with its traceback) is not shown, the
    run's one line is (exit 2)."""
    random = os.urandom(18 << 20)
    lines = [b'{"join_id":"' + base64.b64encode(random[i:i + 768]) + b'"}\n'
             for i in range(0, len(random), 768)]
    data = bytearray(gzip.compress(b"".join(lines), compresslevel=1))
    data[-(1 << 20):-(1 << 20) + 64] = bytes(64)
    path = tmp_path / "in.jsonl.gz"
    path.write_bytes(bytes(data))
    run = subprocess.run(
        [str(Path(sys.executable).with_name("fanin")), "run", "--input", str(path), "--output",
         str(tmp_path / "out")], capture_output=True, text=True, timeout=600, check=False)
    errors = [line for line in run.stderr.splitlines() if " INFO " not in line]
    assert run.returncode == 2 and len(errors) == 1, run.stderr[-3000:]
    assert errors[0].startswith(f"fanin: error: input {path} cannot be decompressed after line ")


@pytest.mark.parametrize("suffix", sorted(COMPRESSORS))
def test_a_stream_cut_short_is_refused_after_the_lines_before_the_cut(tmp_path: Path,
                                                                     suffix: str) -> None:
    """Its end is cut off (a copy or an upload that stopped): the codec tells, so it is
    refused like damage (it was read to where it was cut without a word: nothing at all from
    a bzip2 or zstd file)."""
    content = b"".join(b'{"n":%d}\n' % n for n in range(20_000))
    whole = COMPRESSORS[suffix](content)
    path = tmp_path / f"in.jsonl{suffix}"
    for cut in (whole[:-6], whole[:len(whole) // 2]):
        path.write_bytes(cut)
        got: list[bytes] = []
        with pytest.raises(UnreadableInput, match=r"cannot be decompressed (at its start|after "
                           r"line \d+) \(the file is cut short\) \(EOFError: ") as refused, \
                input_lines(str(path)) as lines:
            got.extend(lines)
        assert got == content.splitlines(keepends=True)[:len(got)]
        assert (f"after line {len(got)} (" if got else "at its start (") in str(refused.value)


@pytest.mark.parametrize("suffix", sorted(COMPRESSORS))
def test_streams_back_to_back_are_read_and_an_empty_file_has_no_lines(tmp_path: Path,
                                                                      suffix: str) -> None:
    path = tmp_path / f"in.jsonl{suffix}"
    first = b"".join(b"%d\n" % n for n in range(40_000))  # beyond a step of 64 KiB
    path.write_bytes(COMPRESSORS[suffix](first) + COMPRESSORS[suffix](b"2\n3"))
    # the second stream was read twice where the first ended in a step that had input left
    assert read(path) == [*first.splitlines(keepends=True), b"2\n", b"3"]
    path.write_bytes(b"")
    assert read(path) == []


@pytest.mark.parametrize("suffix", ["", *sorted(COMPRESSORS)])
def test_a_long_line_is_never_held_whole(tmp_path: Path, suffix: str) -> None:
    """64 MiB in one line (a few hundred KiB compressed) comes as its first bytes and its
    size; reading it holds a few MiB at most (it was decompressed whole, then held whole)."""
    import tracemalloc

    long = b"x" * (64 << 20)
    content = b'{"a":1}\n' + long + b"\r\n" + "é".encode() * 100 + b"\n" + b"y" * 155 + b"\r\n"
    path = tmp_path / f"in.jsonl{suffix}"
    path.write_bytes(COMPRESSORS[suffix](content) if suffix else content)
    del long
    tracemalloc.start()
    try:
        with input_lines(str(path), 150) as lines:
            got = [(type(line).__name__, bytes(line), getattr(line, "size", None))
                   for line in lines]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == [("bytes", b'{"a":1}\n', None), ("LongLine", b"x" * 156, 64 << 20),
                   ("LongLine", "é".encode() * 78, 200),  # whole characters: 156 bytes
                   ("LongLine", b"y" * 155, 155)]  # not the "\r" of its ending
    assert peak < 24 << 20, peak  # (an xz stream's dictionary: 8 MiB)


def test_the_check_opens_every_file_and_names_one_it_cannot(tmp_path: Path) -> None:
    plain = tmp_path / "in.jsonl"
    plain.write_bytes(CONTENT)
    check_start(str(plain))  # raises nothing
    absent = tmp_path / "gone.jsonl"  # e.g. deleted between the listing and the run
    with pytest.raises(UnreadableInput) as refused:
        check_start(str(absent))
    assert str(refused.value) == f"input {absent} cannot be read (No such file or directory)"


def test_a_file_named_twice_is_read_once_whatever_its_spelling(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    from fanin.transforms.read import expand_inputs

    (tmp_path / "d").mkdir()
    first, other = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_bytes(CONTENT)
    other.write_bytes(CONTENT)
    (tmp_path / "link.jsonl").symlink_to(first)
    monkeypatch.chdir(tmp_path)
    spellings = ["./a.jsonl", str(first), "d/../a.jsonl", "link.jsonl", str(tmp_path / "*.jsonl")]
    assert expand_inputs(spellings) == ["./a.jsonl", str(other)]


def test_a_glob_without_a_folder_matches_in_the_current_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--input '*.jsonl'`` reads the current folder's files, named as the user would write
    them (Beam's local match found nothing for a glob without a folder: "matches no file")."""
    from fanin.transforms.read import expand_inputs

    for name in ("b.jsonl", "a.jsonl", "c.txt"):
        (tmp_path / name).write_bytes(CONTENT)
    (tmp_path / "d.jsonl").mkdir()
    monkeypatch.chdir(tmp_path)
    assert expand_inputs(["*.jsonl"]) == ["a.jsonl", "b.jsonl"]
    assert expand_inputs(["?.txt", "a.jsonl"]) == ["c.txt", "a.jsonl"]
    with pytest.raises(FileNotFoundError, match="matches no file: x"):
        expand_inputs(["x*"])


@pytest.mark.parametrize("where", ["in a folder", "in the current folder"])
def test_a_glob_matches_a_file_whose_name_holds_a_backslash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """Beam's glob reads ``*`` as ``[^/\\\\]*``: such a file was skipped without a word (and a
    glob matching only it "matched no file")."""
    from fanin.cli import main
    from fanin.transforms.read import expand_inputs

    (tmp_path / "in").mkdir()
    for name in ("a\\b.jsonl", "ok.jsonl", "c[1].jsonl"):
        (tmp_path / "in" / name).write_bytes(b"not json\n")
    (tmp_path / "in" / "d\\e.jsonl").mkdir()
    if where == "in the current folder":
        monkeypatch.chdir(tmp_path / "in")
        folder = ""
    else:
        folder = str(tmp_path / "in") + os.sep
    assert expand_inputs([f"{folder}*.jsonl"]) == \
        [f"{folder}{name}" for name in ("a\\b.jsonl", "c[1].jsonl", "ok.jsonl")]
    assert expand_inputs([f"{folder}a*"]) == [f"{folder}a\\b.jsonl"]
    out = tmp_path / "out"
    assert main(["run", "--input", f"{folder}*.jsonl", "--output", str(out)]) == 0
    lines = [line for path in (out / "dead_letter").glob("*.jsonl")
             for line in path.read_text().splitlines()]
    assert len(lines) == 3


def test_an_input_file_name_that_is_not_utf8_is_named_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It was ``'utf-8' codec can't encode character '\\udcff' in position 10: surrogates not
    allowed``, naming neither the file nor the option."""
    from fanin.cli import main

    (tmp_path / "in").mkdir()
    name = os.fsdecode(b"a\xffb.jsonl")
    (tmp_path / "in" / name).write_bytes(b"not json\n")
    out = tmp_path / "out"
    assert main(["run", "--input", str(tmp_path / "in" / "*.jsonl"), "--output", str(out)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"fanin: error: input file name is not UTF-8: {tmp_path / 'in' / 'a'}\\xffb.jsonl "
        "(rename it)"]
    assert not out.exists()


def test_a_glob_with_wildcards_in_its_folders_is_left_to_beams_match(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding the backslash-named files of such a glob read them alone where Beam's relative
    match finds nothing (``*/*.jsonl`` read ``d2/b\\c.jsonl`` only, not ``d1/a.jsonl``), and
    a ``**`` (Python's also matches no folder) read a file's neighbour but not the file."""
    from fanin.transforms.read import expand_inputs

    for name in ("d1/a.jsonl", "d2/b\\c.jsonl", "d3/sub/deep.jsonl"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"not json\n")
    monkeypatch.chdir(tmp_path)
    for pattern in ("*/*.jsonl", "d*/*.jsonl"):
        with pytest.raises(FileNotFoundError, match="matches no file"):
            expand_inputs([pattern])
    beams = expand_inputs([str(tmp_path / "**" / "*.jsonl")])
    assert str(tmp_path / "d2" / "b\\c.jsonl") not in beams  # Beam's ``*``: no backslash
    assert str(tmp_path / "d1" / "a.jsonl") in beams


def test_xz_stream_padding_is_read_as_xz_and_beams_reader_read_it(tmp_path: Path) -> None:
    """The xz format lets zero bytes follow a stream: they are no stream cut short."""
    path = tmp_path / "in.jsonl.xz"
    path.write_bytes(lzma.compress(b"1\n2\n") + bytes(1024) + lzma.compress(b"3\n") + bytes(8))
    assert read(path) == [b"1\n", b"2\n", b"3\n"]


def test_a_cut_inside_a_long_lines_rest_names_the_line_before_it(tmp_path: Path) -> None:
    """The long line never came out: the last line read is the one before it."""
    content = b'{"a":1}\n' + os.urandom(3 << 20).hex().encode() + b"\n" + b'{"b":2}\n'
    packed = bz2.compress(content)
    path = tmp_path / "in.jsonl.bz2"
    path.write_bytes(packed[:len(packed) * 3 // 4])
    got: list[bytes] = []
    with pytest.raises(UnreadableInput, match=r"after line 1 \(the file is cut short\)"), \
            input_lines(str(path), 1000) as lines:
        got.extend(lines)
    assert got == [b'{"a":1}\n']


@pytest.mark.parametrize("line", [b"x" * 5000, "é".encode() * 2000, b"\xff" * 3000,
                                  b'{"join_id": "j", "value": "' + b"v" * 4000 + b'"}'])
def test_a_message_too_large_keeps_the_same_first_bytes_from_a_file_and_from_pub_sub(
        tmp_path: Path, line: bytes) -> None:
    """docs/spec.md §1 "Long lines": a Pub/Sub message (its whole data, one bytes value)
    beyond ``--max-bytes`` gives the dead letter the same line read from a file gives: its
    first bytes and its full size (it kept the whole message: a 10 MB message of ``\\xff``
    made a 43 MB dead-letter line)."""
    from fanin.contracts.lines import message_lines
    from fanin.contracts.parsing import parse_message

    path = tmp_path / "in.jsonl"
    path.write_bytes(line + b"\n")
    with input_lines(str(path), 1000) as lines:
        [(from_file, _)] = list(message_lines(lines))
    source = {"kind": "pubsub"}
    letters = [parse_message(data, source, (), 1000)[1] for data in (from_file, line)]
    assert letters[0] == letters[1] and letters[0] is not None
    letter = letters[0]
    kept = base64.b64decode(letter["raw_base64"]) if "raw_base64" in letter else \
        letter["raw"].encode()
    assert 1000 < len(kept) <= 1006 and line.startswith(kept)
    assert letters[0]["detail"] == f"{len(line)} bytes > limit 1000"
    text = parse_message(line.decode(), source, (), 1000)[1] if line.isascii() else None
    assert text is None or text == letters[0]  # a message given as text: the same
