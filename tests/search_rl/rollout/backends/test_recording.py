"""Retrieval recordings: keys, the three modes over a backend, replay-only runs, several writer processes, the CLI.

Run: python -m pytest tests/search_rl/rollout/backends/test_recording.py -q
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import sqlite3
from collections.abc import Sequence

import pytest

from search_rl.config import RetrieverClientConfig
from search_rl.config.loading import ConfigError
from search_rl.config.search_backends import RecordingConfig
from search_rl.datatypes import Passage
from search_rl.rollout.backends import CostMeter, build_retriever, recorded_fingerprint
from search_rl.rollout.backends.recording import (
    BackendIdentity,
    Entry,
    RecordingMiss,
    RecordingRetriever,
    RecordingStore,
    retrieval_key,
)
from search_rl.tools import recordings


class CountingBackend:
    """A live backend whose answers change with every call, so a replayed answer is told apart from a live one."""

    def __init__(self, name: str = "a") -> None:
        self.meter = CostMeter()
        self.fp = BackendIdentity.of("http", method="bm25", num_documents=10, name=name)

    def fingerprint(self) -> BackendIdentity:
        return self.fp

    async def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]:
        out = []
        for q in queries:
            self.meter.calls += 1
            out.append([Passage(f"{q}-{self.meter.calls}-{i}", "T", f"text {i}", 1.0) for i in range(topk or 3)])
        return out


def search(retriever, queries, topk=None):
    return asyncio.run(retriever.search(queries, topk))


def test_keys_ignore_whitespace_but_not_case_topk_or_backend():
    k = retrieval_key("who wrote  Hamlet", 3, "fp")
    assert k == retrieval_key(" who wrote Hamlet ", 3, "fp")
    assert len({k, retrieval_key("Who wrote Hamlet", 3, "fp"), retrieval_key("who wrote Hamlet", 5, "fp")}) == 3
    assert k != retrieval_key("who wrote Hamlet", 3, "other")


def test_fingerprint_round_trips_through_its_description():
    fp = BackendIdentity.of("web", provider="serper", date="2026-11-26", page_chars=None)
    assert BackendIdentity.parse(fp.describe()) == fp and BackendIdentity.parse(fp.describe()).id == fp.id
    assert dict(fp) == {"id": fp.id, "backend": "web", "provider": "serper", "date": "2026-11-26"}


def test_record_then_replay_gives_the_recorded_passages(tmp_path):
    path = tmp_path / "rec.sqlite"
    live = CountingBackend()
    recorder = RecordingRetriever(RecordingStore(path), "record", live.fingerprint(), 3, live)
    recorded = search(recorder, ["q1", "q2", "q1"])
    assert live.meter.calls == 2 and recorded[0] == recorded[2]  # a query asked twice in one batch is searched once
    recorded = search(recorder, ["q1"]) + recorded[1:2]
    assert live.meter.calls == 3  # record writes through: every batch reaches the backend, the newest answer wins
    replayer = RecordingRetriever(RecordingStore(path), "replay", live.fingerprint(), 3)
    assert search(replayer, ["q2", "q1"]) == [recorded[1], recorded[0]]
    assert replayer.meter.totals() == (0, 0.0, 2)
    keys = replayer.retrieval_keys(["q1"])
    assert RecordingStore(path).get_many(keys)[keys[0]].query == "q1"


def test_replay_miss_names_the_query_or_falls_through(tmp_path):
    path = tmp_path / "rec.sqlite"
    live = CountingBackend()
    RecordingRetriever(RecordingStore(path), "record", live.fp, 3, live)
    strict = RecordingRetriever(RecordingStore(path), "replay", live.fp, 3, live)
    with pytest.raises(RecordingMiss, match="'never recorded'"):
        search(strict, ["never recorded"])
    assert live.meter.calls == 0
    lenient = RecordingRetriever(RecordingStore(path), "replay", live.fp, 3, live, on_miss="live")
    assert len(search(lenient, ["never recorded"])[0]) == 3 and live.meter.calls == 1
    assert RecordingStore(path).get_many(lenient.retrieval_keys(["never recorded"])) == {}  # replay never writes


def test_cache_serves_hits_and_records_misses(tmp_path):
    live = CountingBackend()
    cache = RecordingRetriever(RecordingStore(tmp_path / "c.sqlite"), "cache", live.fp, 2, live)
    first = search(cache, ["a", "b"])
    again = search(cache, ["b", "c", "a"])
    assert again[0] == first[1] and again[2] == first[0]
    assert live.meter.calls == 3 and cache.meter.totals() == (3, 0.0, 2)
    assert search(cache, ["a"], topk=4)[0] != first[0]  # another top-k is another key


def test_replay_backend_picks_the_only_or_the_named_fingerprint(tmp_path):
    path = tmp_path / "rec.sqlite"
    a, b = CountingBackend("a"), CountingBackend("b")
    search(RecordingRetriever(RecordingStore(path), "record", a.fp, 3, a), ["x"])
    cfg = RetrieverClientConfig(backend="replay", recording=RecordingConfig(path=str(path)))
    assert search(build_retriever(cfg), ["x"])[0][0].id == "x-1-0"
    search(RecordingRetriever(RecordingStore(path), "record", b.fp, 3, b), ["x"])
    with pytest.raises(ValueError, match="holds 2 recorded backends"):
        build_retriever(cfg)
    cfg.recording.fingerprint = b.fp.id
    assert recorded_fingerprint(RecordingStore(path), b.fp.id) == b.fp
    assert search(build_retriever(cfg), ["x"])[0][0].id == "x-1-0"
    with pytest.raises(FileNotFoundError, match="no recording there"):
        build_retriever(RetrieverClientConfig(backend="replay", recording=RecordingConfig(path=str(tmp_path / "no"))))


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="retriever.backend must be one of"):
        RetrieverClientConfig(backend="bing")
    with pytest.raises(ConfigError, match="retriever.recording.path"):
        RecordingConfig(mode="cache")
    with pytest.raises(ConfigError, match="on_miss=error"):
        RetrieverClientConfig(backend="replay", recording=RecordingConfig(path="x", on_miss="live"))


def _write_entries(path: str, worker: int, n: int) -> None:
    store = RecordingStore(path)
    for i in range(n):  # one transaction per entry: the most lock contention
        p = (Passage(f"{worker}-{i}", "t", "x"),)
        store.put_many([Entry(retrieval_key(f"w{worker} q{i}", 3, "fp"), "fp", f"q{i}", 3, p, 0.0)], replace=False)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_several_writer_processes_lose_nothing(tmp_path):
    path = str(tmp_path / "shared.sqlite")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_write_entries, args=(path, w, 40)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM retrievals").fetchone()[0] == 160
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_cli_lists_shows_and_merges(tmp_path, capsys):
    a, b = CountingBackend("a"), CountingBackend("b")
    rec_a = RecordingRetriever(RecordingStore(tmp_path / "a.sqlite"), "record", a.fp, 3, a)
    search(rec_a, ["capital of France"])
    search(RecordingRetriever(RecordingStore(tmp_path / "b.sqlite"), "record", b.fp, 3, b), ["q"])
    key = rec_a.retrieval_keys(["capital of France"])[0]
    assert recordings.main(["list", str(tmp_path / "a.sqlite")]) == 0
    assert f"{a.fp.id}         1 entries" in capsys.readouterr().out
    assert recordings.main(["show", str(tmp_path / "a.sqlite"), key[:10]]) == 0
    out = capsys.readouterr().out
    assert "query: capital of France" in out and "Doc 3 [capital of France-1-2]" in out
    assert (
        recordings.main(["merge", str(tmp_path / "all.sqlite"), str(tmp_path / "a.sqlite"), str(tmp_path / "b.sqlite")])
        == 0
    )
    assert {a.fp.id, b.fp.id} <= set(capsys.readouterr().out.split())
    merged = RecordingStore(tmp_path / "all.sqlite")
    assert len(list(merged.entries())) == 2 and merged.get_many([key])[key].passages[0].id == "capital of France-1-0"
    assert recordings.main(["entries", str(tmp_path / "all.sqlite"), "--query", "FRANCE", "--json"]) == 0
    [row] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["key"] == key and row["fingerprint"] == a.fp.id and len(row["passages"]) == 3
    assert recordings.main(["show", str(tmp_path / "a.sqlite"), "ffff"]) == 2
    assert recordings.main(["list", str(tmp_path / "missing.sqlite")]) == 2


@pytest.mark.parametrize("name", ["run#2.sqlite", "what?.sqlite", "x%41.sqlite", "my run.sqlite", "a #?%b.sqlite"])
def test_odd_file_names_open_that_file_and_read_only_refuses_writes(tmp_path, name):
    live = CountingBackend()
    path = tmp_path / name
    recorder = RecordingRetriever(RecordingStore(path), "record", live.fp, 3, live)
    search(recorder, ["q1"])
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(("-wal", "-shm"))) == [name]
    [key] = recorder.retrieval_keys(["q1"])
    read_only = RecordingStore(path, read_only=True)
    assert read_only.get_many([key])[key].query == "q1"
    entry = Entry("k", live.fp.id, "q2", 3, (), 0.0)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        read_only.put_many([entry], replace=True)
    merged = RecordingStore(tmp_path / "merged #1.sqlite")
    assert merged.merge_from(path) == 1 and merged.get_many([key])[key].query == "q1"
