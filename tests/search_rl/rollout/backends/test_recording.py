"""Retrieval recordings: keys, the three modes over a backend (searches and opened documents), replay-only runs,
files older than the documents table, several writer processes, the CLI.

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
from search_rl.rollout.backends.identity import BackendIdentity
from search_rl.rollout.backends.recording import RecordingMiss, RecordingRetriever
from search_rl.rollout.backends.recording_store import Entry, RecordingStore, document_key, retrieval_key
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


class DocumentBackend(CountingBackend):
    """A live backend that also serves documents, each answer numbered by call; ids starting ``no-`` are unknown."""

    def __init__(self, name: str = "a") -> None:
        super().__init__(name)
        self.opened: list[str] = []

    async def documents(self, ids: Sequence[str], max_chars: int) -> list[Passage | None]:
        self.opened += ids
        return [None if i.startswith("no-") else Passage(i, "T", f"{i} #{len(self.opened)}"[:max_chars]) for i in ids]


def search(retriever, queries, topk=None):
    return asyncio.run(retriever.search(queries, topk))


def documents(retriever, ids, max_chars=100):
    return asyncio.run(retriever.documents(ids, max_chars))


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


def test_record_then_replay_documents_gives_the_recorded_articles_and_unknown_ids(tmp_path):
    path = tmp_path / "rec.sqlite"
    live = DocumentBackend()
    recorder = RecordingRetriever(RecordingStore(path), "record", live.fp, 3, live)
    recorded = documents(recorder, ["1", "no-such", "1", "2"])
    assert sorted(live.opened) == ["1", "2", "no-such"], "an id asked twice in one call is fetched once"
    assert recorded[1] is None and recorded[0] == recorded[2] == Passage("1", "T", "1 #3")
    replayer = RecordingRetriever(RecordingStore(path, read_only=True), "replay", live.fp, 3)
    assert replayer.serves_documents, "a replay-only recording of the retriever service serves documents"
    assert documents(replayer, ["2", "no-such", "1"]) == [recorded[3], None, recorded[0]]
    assert (replayer.document_hits, replayer.document_misses) == (3, 0)
    assert replayer.meter.totals() == (0, 0.0, 0), "the search meter does not count documents"
    [key] = replayer.document_keys(["no-such"], 100)
    assert key == document_key("no-such", 100, live.fp.id) != document_key("no-such", 50, live.fp.id)
    assert RecordingStore(path).get_documents([key])[key].passage is None


def test_document_replay_miss_names_the_id_or_falls_through(tmp_path):
    path = tmp_path / "rec.sqlite"
    live = DocumentBackend()
    documents(RecordingRetriever(RecordingStore(path), "record", live.fp, 3, live), ["1"])
    strict = RecordingRetriever(RecordingStore(path), "replay", live.fp, 3, live)
    with pytest.raises(RecordingMiss, match=r"1 of 2 documents are not in the recording .*first: id '7'.*on_miss=live"):
        documents(strict, ["1", "7"])
    with pytest.raises(RecordingMiss, match="first: id '1'"):
        documents(strict, ["1"], max_chars=5)  # another length is another key
    assert live.opened == ["1"]
    lenient = RecordingRetriever(RecordingStore(path), "replay", live.fp, 3, live, on_miss="live")
    assert documents(lenient, ["1", "7"]) == [Passage("1", "T", "1 #1"), Passage("7", "T", "7 #2")]
    assert live.opened == ["1", "7"] and (lenient.document_hits, lenient.document_misses) == (1, 1)
    assert RecordingStore(path).get_documents(lenient.document_keys(["7"], 100)) == {}  # replay never writes


def test_document_cache_serves_hits_and_records_misses(tmp_path):
    live = DocumentBackend()
    cache = RecordingRetriever(RecordingStore(tmp_path / "c.sqlite"), "cache", live.fp, 3, live)
    first = documents(cache, ["1", "no-x"])
    again = documents(cache, ["no-x", "2", "1", "2"])
    assert again[0] is None and again[2] == first[0] and again[1] == again[3] == Passage("2", "T", "2 #3")
    assert live.opened == ["1", "no-x", "2"] and (cache.document_hits, cache.document_misses) == (2, 3)
    assert documents(cache, ["1"], max_chars=2) == [Passage("1", "T", "1 ")]


def test_a_backend_without_documents_is_named(tmp_path):
    web = CountingBackend()
    web.fp = BackendIdentity.of("web", provider="serper", date="2026-11-26")
    recorder = RecordingRetriever(RecordingStore(tmp_path / "w.sqlite"), "record", web.fp, 3, web)
    assert not recorder.serves_documents
    with pytest.raises(TypeError, match=f"search backend web \\(fingerprint {web.fp.id}\\) serves no documents"):
        documents(recorder, ["1"])
    search(recorder, ["q"])
    assert not RecordingRetriever(RecordingStore(tmp_path / "w.sqlite"), "replay", web.fp, 3).serves_documents


OLD_SCHEMA = """
CREATE TABLE fingerprints (id TEXT PRIMARY KEY, backend TEXT NOT NULL, description TEXT NOT NULL,
                           created_at REAL NOT NULL);
CREATE TABLE retrievals (key TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, query TEXT NOT NULL,
                         topk INTEGER NOT NULL, passages TEXT NOT NULL, created_at REAL NOT NULL);
"""


def test_a_recording_older_than_the_documents_table_still_replays(tmp_path):
    path, fp = tmp_path / "old.sqlite", CountingBackend().fp
    passages = '[{"id": "9", "title": "T", "text": "x", "score": 1.0}]'
    with sqlite3.connect(path) as conn:
        conn.executescript(OLD_SCHEMA)
        conn.execute("INSERT INTO fingerprints VALUES (?, ?, ?, 0)", (fp.id, fp.backend, fp.describe()))
        conn.execute(
            "INSERT INTO retrievals VALUES (?, ?, 'q', 3, ?, 0)", (retrieval_key("q", 3, fp.id), fp.id, passages)
        )
    old = RecordingStore(path, read_only=True)
    replayer = RecordingRetriever(old, "replay", fp, 3)
    assert search(replayer, ["q"]) == [[Passage("9", "T", "x", 1.0)]]
    with pytest.raises(RecordingMiss, match="first: id '9'"):  # a miss, not "no such table"
        documents(replayer, ["9"])
    assert old.fingerprints() == [(fp.id, fp.describe(), 1)] and not old.has_documents()
    merged = RecordingStore(tmp_path / "new.sqlite")
    assert merged.merge_from(path) == 1 and merged.has_documents()
    live = DocumentBackend()
    writer = RecordingRetriever(RecordingStore(path), "cache", fp, 3, live)  # a writable open adds the table
    documents(writer, ["9"])
    assert RecordingStore(path, read_only=True).fingerprints() == [(fp.id, fp.describe(), 2)]


def test_merge_lists_and_shows_documents(tmp_path, capsys):
    live = DocumentBackend()
    rec = RecordingRetriever(RecordingStore(tmp_path / "a.sqlite"), "record", live.fp, 3, live)
    search(rec, ["q"])
    documents(rec, ["1", "no-x"])
    merged = RecordingStore(tmp_path / "all.sqlite")
    assert merged.merge_from(tmp_path / "a.sqlite") == 3 and merged.merge_from(tmp_path / "a.sqlite") == 0
    keys = rec.document_keys(["1", "no-x"], 100)
    stored = merged.get_documents(keys)
    assert [stored[k].passage for k in keys] == [Passage("1", "T", "1 #2"), None]
    assert recordings.main(["list", str(tmp_path / "all.sqlite")]) == 0
    assert f"{live.fp.id}         3 entries" in capsys.readouterr().out
    assert recordings.main(["show", str(tmp_path / "all.sqlite"), keys[0][:12]]) == 0
    assert "opened: 1\n  [1] T: 1 #2" in capsys.readouterr().out
    assert recordings.main(["show", str(tmp_path / "all.sqlite"), keys[1]]) == 0
    assert "opened: no-x\n  (no document has this id)" in capsys.readouterr().out
