"""Whole-pipeline runs: parity (batch == replay == core), conservation, multi-process, CLI."""

from __future__ import annotations

import gzip
import json
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from spec.invariants import check_run

from fanin.cli import main
from fanin.contracts.catalog import Catalog, JoinDefaults, load_contracts
from fanin.contracts.lines import message_lines
from fanin.contracts.parsing import parse_message
from fanin.core.bounded import bounded_outputs
from fanin.fleet.simulate import CONTRACTS_PATH, write_simulation
from fanin.pipelines.pipeline import RunConfig, run_pipeline
from fanin.transforms.read import numbered_lines
from fanin.transforms.replay import scan_line

KINDS = ("closes", "late", "dead_letter")


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("traffic")
    shuffled = folder / "arrival.jsonl"
    write_simulation(shuffled, joins=120, seed=3)
    in_order = folder / "in_order.jsonl"
    keyed, last = [], 0
    for number, line in enumerate(shuffled.read_bytes().splitlines()):
        t, _ = scan_line(line)
        last = last if t is None else t
        keyed.append((last, number, line))
    in_order.write_bytes(b"\n".join(line for _, _, line in sorted(keyed)) + b"\n")
    return {"arrival": shuffled, "in_order": in_order}


def run(path: Path, out: Path, *beam_args: str, **config: Any) -> dict[str, list[dict[str, Any]]]:
    """Run the pipeline; its outputs, checked against the run invariants of docs/spec.md
    (``tests/spec/invariants.py``: strict for bounded runs; a replay may deliver messages
    behind the watermark, which are late whatever their event time)."""
    run_pipeline(RunConfig(output=str(out), inputs=[str(path)], contracts_path=CONTRACTS_PATH,
                           **config), list(beam_args))
    found = read_outputs(out)
    with path.open("rb") as handle:
        check_run([line for line, _ in message_lines(handle)], found,
                  eager=bool(config.get("replay")))
    return found


def read_outputs(out: Path) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for kind in KINDS:
        lines = [json.loads(line) for f in sorted((out / kind).glob("*.jsonl"))
                 for line in f.read_text().splitlines()]
        found[kind] = sorted(lines, key=lambda obj: json.dumps(obj, sort_keys=True))
    return found


def core_outputs(path: Path) -> dict[str, list[dict[str, Any]]]:
    """The reducer core alone, by hand: group valid records by join and decide each."""
    catalog = Catalog(load_contracts(CONTRACTS_PATH))
    by_join: dict[str, list[Any]] = defaultdict(list)
    found: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    for line, source in numbered_lines(str(path)):
        record, dead = parse_message(line, source, catalog.contracts)
        if dead is not None:
            found["dead_letter"].append(dead)
        else:
            by_join[record[1]].append(record)
    for records in by_join.values():
        for kind, obj in bounded_outputs(records, catalog, 100_000, 16 * 1024 * 1024):
            found[kind].append(obj)
    for kind in KINDS:
        found[kind].sort(key=lambda obj: json.dumps(obj, sort_keys=True))
    return found


def without_detail(outputs: dict[str, list[dict[str, Any]]]) -> dict[str, list[Any]]:
    return {k: [{**o, "detail": None} if k == "dead_letter" else o for o in v]
            for k, v in outputs.items()}


def test_parity_batch_replay_core_on_in_order_arrival(traffic: dict[str, Path],
                                                      tmp_path: Path) -> None:
    # The watermark trigger: docs/spec.md §4 promises the bounded result when no message is behind
    # the
    # watermark. (Eager closes on arrival, so a redelivery that arrives after the close is
    # late even with an equal event time: tests/pipeline/test_streaming.py covers that.)
    watermark = JoinDefaults(close_trigger="watermark")
    batch = run(traffic["in_order"], tmp_path / "batch")
    replay = run(traffic["in_order"], tmp_path / "replay", replay=True, defaults=watermark)
    core = core_outputs(traffic["in_order"])
    assert len(batch["closes"]) > 50 and batch["late"] and batch["dead_letter"]
    assert batch == replay
    assert without_detail(batch) == without_detail(core)


def conserved(outputs: dict[str, list[dict[str, Any]]], path: Path) -> None:
    lines = sum(1 for line in path.read_bytes().splitlines() if line)
    folded = sum(close["counts"]["messages"] for close in outputs["closes"])
    assert folded + len(outputs["late"]) + len(outputs["dead_letter"]) == lines
    assert len({c["join_id"] for c in outputs["closes"]}) == len(outputs["closes"])


def test_conservation_batch_replay_and_multiprocess(traffic: dict[str, Path],
                                                    tmp_path: Path) -> None:
    path = traffic["arrival"]
    batch = run(path, tmp_path / "batch")
    conserved(batch, path)
    conserved(run(path, tmp_path / "replay", replay=True, max_disorder_s=2), path)
    multi = run(path, tmp_path / "multi", "--runner=FnApiRunner", "--direct_num_workers=2",
                "--direct_running_mode=multi_processing")
    assert multi == batch


def test_same_input_twice_gives_byte_identical_files(traffic: dict[str, Path],
                                                     tmp_path: Path) -> None:
    run(traffic["arrival"], tmp_path / "one")
    run(traffic["arrival"], tmp_path / "two")
    for kind in KINDS:
        one = {p.name: p.read_bytes() for p in (tmp_path / "one" / kind).iterdir()}
        two = {p.name: p.read_bytes() for p in (tmp_path / "two" / kind).iterdir()}
        assert one == two and one


def test_summary_line_counts_parquet_only_outputs(traffic: dict[str, Path], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """With --format parquet alone the summary counts the Parquet rows (closes in date
    partitions), the same numbers as the JSONL lines of a JSONL run."""
    counts = {}
    for fmt in ("jsonl", "parquet"):
        assert main(["run", "--input", str(traffic["arrival"]), "--contracts", CONTRACTS_PATH,
                     "--output", str(tmp_path / fmt), "--format", fmt]) == 0
        line = capsys.readouterr().err.rstrip().splitlines()[-1]
        assert line.startswith("fanin: done: closes="), line
        counts[fmt] = line.split(";")[0]
    assert counts["parquet"] == counts["jsonl"] and "closes=0 " not in counts["jsonl"]


@pytest.mark.parametrize("mode", [[], ["--replay"]], ids=["bounded", "replay"])
def test_overwrite_never_deletes_an_input(traffic: dict[str, Path], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str],
                                          mode: list[str]) -> None:
    """An input inside an output folder the run would replace: one line, exit 2, nothing
    deleted (it was deleted before the read, and the run failed with tracebacks)."""
    out = tmp_path / "out"
    assert main(["run", "--input", str(traffic["arrival"]), "--contracts", CONTRACTS_PATH,
                 "--output", str(out)]) == 0
    capsys.readouterr()
    before = {p: p.read_bytes() for p in out.rglob("*.jsonl")}
    assert main(["run", "--input", str(out / "dead_letter" / "*.jsonl"), "--contracts",
                 CONTRACTS_PATH, "--output", str(out), "--overwrite", *mode]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("fanin: error: --input ") and "move it out first" in err[-1]
    assert not any("Traceback" in line for line in err)
    assert {p: p.read_bytes() for p in out.rglob("*.jsonl")} == before


def test_overwrite_never_deletes_the_contracts_file(traffic: dict[str, Path], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A ``--contracts`` file kept in an output folder was deleted by ``--overwrite`` (inputs
    were refused there already)."""
    out = tmp_path / "out"
    assert main(["run", "--input", str(traffic["arrival"]), "--contracts", CONTRACTS_PATH,
                 "--output", str(out)]) == 0
    capsys.readouterr()
    kept = out / "late" / "contracts.yaml"
    shutil.copyfile(CONTRACTS_PATH, kept)
    assert main(["run", "--input", str(traffic["arrival"]), "--contracts", str(kept),
                 "--output", str(out), "--overwrite"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"fanin: error: --contracts {kept} is in {out / 'late'}, which this run replaces with "
        "its outputs; move it out first")
    assert kept.read_bytes() == Path(CONTRACTS_PATH).read_bytes()


def test_cli_runs_and_refuses_bad_use(traffic: dict[str, Path], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli"
    (tmp_path / "not-gzip.jsonl.gz").write_bytes(traffic["arrival"].read_bytes())
    args = ["run", "--input", str(traffic["arrival"]), "--contracts", CONTRACTS_PATH,
            "--output", str(out)]
    assert main([*args[:-1], f"{out}/"]) == 0  # a trailing "/": no "//" in the summary
    assert "closes=" in (err := capsys.readouterr().err)
    assert err.rstrip().endswith(f"; outputs in {out}/{{closes,late,dead_letter}}/")
    assert main(args) == 2  # an earlier run's outputs are not mixed in silently
    assert "--overwrite" in capsys.readouterr().err
    bad = [
        ["run", "--input", str(tmp_path / "none*.jsonl"), "--output", str(out / "x")],
        ["run", "--input", str(traffic["arrival"]), "--output", str(out / "y"),
         "--contracts", str(tmp_path / "missing.yaml")],
        ["run", "--input", str(traffic["arrival"]), "--output", str(out / "z"), "--bogus"],
        ["run", "--output", str(out / "w")],
        ["run", "--input", str(traffic["arrival"]), "--output", str(out / "v"),
         "--deadline-s", "0"],
        ["run", "--subscription", "projects/my-proj/subscriptions/sub", "--id-label", "mid",
         "--output", str(out / "u")],  # id_label is Dataflow-only
        ["run", "--input", str(tmp_path), "--output", str(out / "t")],  # a folder
        *(["run", "--input", str(traffic["arrival"]), "--output", str(out / "s"), "--replay",
           "--max-disorder-s", value] for value in ("inf", "nan", "-1")),
        *(["run", "--subscription", "projects/my-proj/subscriptions/sub", "--output",
           str(out / "s"), "--window-s", value]  # 1e300: Beam's translation raised 'Value out
          for value in ("inf", "nan", "-1", "1e300", "86401")),  # of range'
        # options for another kind of run: a user who forgot --replay believed it a stream
        ["run", "--input", str(traffic["arrival"]), "--output", str(out / "s"),
         "--max-disorder-s", "5"],
        ["run", "--subscription", "projects/my-proj/subscriptions/sub", "--output",
         str(out / "s"), "--max-disorder-s", "0"],
        *(["run", "--input", str(traffic["arrival"]), "--output", str(out / "s"), *replay,
           "--window-s", "5"] for replay in ([], ["--replay"])),
        *(["run", "--input", str(traffic["arrival"]), "--output", str(out / "s"), "--shards",
           shards] for shards in ("0", "1001")),  # s<shard> names have three digits
        # BigQuery file loads need a gs:// --temp_location (Beam failed inside the job)
        ["run", "--input", str(traffic["arrival"]), "--output", str(out / "bq"),
         "--bigquery-dataset", "my-project:fanin"],
        *(["run", "--input", str(tmp_path / "not-gzip.jsonl.gz"), "--output", str(out / "q"),
           *replay] for replay in ([], ["--replay"])),
        ["run", "--input", str(traffic["arrival"]), "--output", str(out / "r"),
         "--max-messages-per-join", str(2**63 - 1)],
        # a Flink option out of range (a traceback from the runner before)
        *(["run", "--input", str(traffic["arrival"]), "--output", str(out / "p"),
           "--runner=FlinkRunner", "--flink_master=[local]", f"--parallelism={n}"]
          for n in ("0", "-2")),
    ]
    for argv in bad:
        with pytest.raises(SystemExit) as info:
            code = main(argv)
            raise SystemExit(code)
        assert info.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("fanin: error: ") and "\n" not in err, argv


def test_a_deadline_past_year_9999_closes_at_its_end_in_batch_and_replay(tmp_path: Path) -> None:
    traffic = tmp_path / "far.jsonl"
    traffic.write_text(
        '{"kind":"open","join_id":"far","opened_at":"2026-01-01T00:00:00Z","required":["a","b"],'
        '"deadline_s":1e13}\n'
        '{"join_id":"far","branch":"a","status":"ok","event_time":"2026-01-01T00:00:01Z"}\n')
    for replay in (False, True):
        out = tmp_path / f"out-{replay}"
        run_pipeline(RunConfig(output=str(out), inputs=[str(traffic)], replay=replay), [])
        (close,) = read_outputs(out)["closes"]
        assert close["reason"] == "timeout"
        assert close["deadline"] == close["closed_at"] == "9999-12-31T23:59:59.999Z"
        assert close["counts"]["messages"] == 2


@pytest.mark.parametrize("replay", [False, True])
def test_a_byte_order_mark_at_the_start_of_a_file_is_not_part_of_its_first_message(
        tmp_path: Path, replay: bool) -> None:
    lines = ['{"kind":"open","join_id":"bom","opened_at":"2026-01-01T00:00:00Z",'
             '"required":["a"]}',
             '{"join_id":"bom","branch":"a","status":"ok","event_time":"2026-01-01T00:00:01Z"}']
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode() + b"\n")
    found = run(path, tmp_path / "out", replay=replay)
    assert found["dead_letter"] == [] and found["late"] == []
    assert [(c["join_id"], c["reason"], c["counts"]["messages"]) for c in found["closes"]] == \
        [("bom", "complete", 2)]


@pytest.mark.parametrize("replay", [False, True])
def test_a_gzip_input_gives_the_outputs_of_its_content(traffic: dict[str, Path],
                                                       tmp_path: Path, replay: bool) -> None:
    """A ``.gz`` file is read decompressed (as Beam's ReadFromText reads it): the outputs are
    those of the plain file, the dead letters' sources naming the compressed file."""
    plain = traffic["arrival"]
    packed = tmp_path / "arrival.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    expected = run(plain, tmp_path / "plain", replay=replay)
    run_pipeline(RunConfig(output=str(tmp_path / "packed"), inputs=[str(packed)],
                           contracts_path=CONTRACTS_PATH, replay=replay), [])
    got = read_outputs(tmp_path / "packed")
    assert got["dead_letter"] and all(d["source"]["file"] == str(packed)
                                      for d in got["dead_letter"])
    for dead in got["dead_letter"]:
        dead["source"]["file"] = str(plain)
    assert got == expected
