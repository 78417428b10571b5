"""The retriever as a Ray Serve application: encoder replicas for throughput, index shards for corpora larger than a
machine, the same HTTP service outside (so the trainer's client does not change).

    ingress (N replicas)  the one-process server's app (``api.app.create_app``): its routes, request limits, error
                          answers, guard middleware, LRU cache, query batching and load shedding, with a loader that
                          encodes each batch of queries here and fans it out to
        -> every shard (M replicas each)  search its FAISS index, return global positions
        <- merged into one top-k per query (``retrievers.sharded.merge_topk``); the documents at the positions
           answered are then fetched from the shards that hold them

``POST /documents`` asks every shard for the ids at once; the shard that holds an id's row answers with its article
within its rows, and an article that crosses a shard boundary is completed from the neighbouring shards, so the
answer is the one-process server's on the same corpus.

A shard is an index file over consecutive corpus rows plus a corpus: either a store holding exactly those rows
(``index_convert --shards K --corpus C`` writes both), or the whole corpus (then the shard reads rows
``offset .. offset + ntotal``). Start it on a running cluster (``ray start --head`` ...)::

    python -m retriever_server.serve.deployment --address auto --port 8000 \\
        --shard e5-shard0of2.index,e5-shard0of2.store --shard e5-shard1of2.index,e5-shard1of2.store \\
        --ingress-replicas 2 --shard-replicas 1

Other settings (encoder, prefixes, nprobe, efSearch, limits) are the ``RETRIEVER_*`` variables of the CLI's shell.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import inspect
import logging
import signal
import threading
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI
from ray import __version__ as ray_version
from ray import serve

from retriever_server.api.app import create_app
from retriever_server.api.schemas import ShardInfo
from retriever_server.api.service import MAX_ARTICLE_ROWS, ArticlePart, CorpusArticles, Document, Hit, joined_article
from retriever_server.api.state import LoadedIndex, ProgressFn
from retriever_server.identity import file_sha256, shards_identity
from retriever_server.retrievers.encoder import Encoder
from retriever_server.retrievers.sharded import merge_topk
from retriever_server.settings import DEFAULT_PORT, Method, Settings

logger = logging.getLogger(__name__)

if inspect.signature(serve.ingress).parameters["app"].default is inspect.Parameter.empty:
    raise ImportError(
        f"the Ray Serve retriever builds its app in each replica (serve.ingress() with __serve_build_asgi_app__), "
        f"which Ray {ray_version} lacks; upgrade: pip install -U 'ray[serve]' (2.60 is tested)"
    )


@dataclass(frozen=True)
class ShardSpec:
    """One shard: its index file, its corpus (its own rows, or the whole corpus) and its first global row."""

    index_path: str
    corpus_path: str
    offset: int


@serve.deployment
class IndexShard:
    """Searches one shard's index and looks up the documents at its global positions."""

    def __init__(self, spec: dict[str, Any], settings: dict[str, Any]) -> None:
        from retriever_server.index.corpus import load_corpus
        from retriever_server.retrievers.dense import read_faiss_index, set_search_params

        s, shard = Settings(**settings), ShardSpec(**spec)
        self.corpus = load_corpus(Path(shard.corpus_path), s.docstore_root())
        self.index = read_faiss_index(Path(shard.index_path), mmap=s.index_mmap)
        n = int(self.index.ntotal)
        own_rows = len(self.corpus) == n
        if not own_rows and len(self.corpus) < shard.offset + n:
            raise ValueError(
                f"shard {shard.index_path}: {n} vectors from row {shard.offset}, but corpus {shard.corpus_path} has "
                f"{len(self.corpus)} rows (neither this shard's rows nor the whole corpus)"
            )
        self.offset, self.doc_base = shard.offset, 0 if own_rows else shard.offset
        self.lookup = CorpusArticles(self.corpus, self.offset - self.doc_base, range(self.offset, self.offset + n))
        self.index_file = Path(shard.index_path)
        self.index_sha256 = file_sha256(self.index_file, s.index_dir)
        set_search_params(self.index, s.hnsw_ef_search, s.ivf_nprobe)

    def search(self, vectors: np.ndarray, topk: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, global positions) for each query row, both ``(Q, topk)``; -1 marks an empty slot."""
        scores, local = self.index.search(vectors, topk)
        return scores, np.where(local >= 0, local + self.offset, -1)

    def documents(self, positions: list[int]) -> dict[int, Document]:
        """The documents at these global positions (all within this shard)."""
        return {p: self.corpus.document(p - self.offset + self.doc_base) for p in positions}

    def articles(self, ids: list[str], max_chars: int) -> list[tuple[int, ArticlePart] | None]:
        """(global row, the part of its article within this shard's corpus) of each id among this shard's rows, else
        None: a shard that reads the whole corpus answers only its own rows, so that one shard answers each id."""
        return self.lookup.parts(ids, max_chars)

    def article_part(self, title: str, position: int, start: int, max_chars: int) -> ArticlePart:
        """The part of an article crossing from a neighbouring shard (hit at ``position``) that holds ``start``, this
        shard's first row or its end, within this shard's rows."""
        return self.lookup.part(title, position, start, max_chars)

    def describe(self) -> dict[str, Any]:
        """This shard's rows, file, hashes and the Ray node this replica runs on."""
        import ray

        return {
            "index": self.index_file.name,
            "rows": int(self.index.ntotal),
            "offset": self.offset,
            "node": ray.get_runtime_context().get_node_id(),
            "dim": int(self.index.d),
            "index_sha256": self.index_sha256,
            "corpus_sha256": self.corpus.sha256,
        }


class ShardFanout:
    """A ``Retriever`` over every shard: encodes the queries here, searches each shard, merges their top-k. It runs
    in the batcher's worker thread, so waiting for the shards blocks nothing else."""

    name = "dense"

    def __init__(self, encoder: Encoder, shards: list[Any]) -> None:
        self.encoder = encoder
        self.shards = shards

    def search(self, queries: list[str], topk: int) -> tuple[np.ndarray, np.ndarray]:
        vectors = self.encoder.encode_queries(queries)  # (Q, dim)
        pending = [shard.search.remote(vectors, topk) for shard in self.shards]
        answers = [p.result() for p in pending]
        return merge_topk([a[0] for a in answers], [a[1] for a in answers], topk)


class ShardDocuments:
    """The documents of hits and the articles of ids, fetched from the shards that hold them."""

    def __init__(self, shards: list[Any], infos: list[ShardInfo]) -> None:
        self.shards, self.offsets = shards, [info.offset for info in infos]  # in row order
        self.total = sum(info.rows for info in infos)

    def __len__(self) -> int:
        return self.total

    def shard_of(self, row: int) -> int:
        """The index of the shard that holds global row ``row``."""
        return bisect.bisect_right(self.offsets, row) - 1

    async def rows(self, hits: list[list[Hit]]) -> list[list[Document]]:
        wanted: dict[int, list[int]] = {}
        for p in {p for row in hits for p, _ in row}:
            wanted.setdefault(self.shard_of(p), []).append(p)
        found: dict[int, Document] = {}
        for part in await asyncio.gather(*(self.shards[i].documents.remote(ps) for i, ps in wanted.items())):
            found |= part
        return [[found[p] for p, _ in row] for row in hits]

    async def articles(self, ids: list[str], max_chars: int) -> list[dict[str, object] | None]:
        """Every shard is asked for every id (one call each); the shard holding an id answers with its part."""
        answers = await asyncio.gather(*(shard.articles.remote(ids, max_chars) for shard in self.shards))
        hits = [next((a[i] for a in answers if a[i] is not None), None) for i in range(len(ids))]
        joined = await asyncio.gather(*(self._article(h[0], h[1], max_chars) for h in hits if h is not None))
        found = iter(joined)
        return [None if h is None else {"id": doc_id, **next(found)} for doc_id, h in zip(ids, hits, strict=True)]

    async def _article(self, position: int, part: ArticlePart, max_chars: int) -> dict[str, object]:
        """The article of the hit at ``position`` from its shard's part: the rows sharing its title at the end of the
        shards before and the start of the shards after are fetched while the part reaches a shard boundary."""
        parts = [part]
        while parts[0].open_before:
            before = self.shards[self.shard_of(parts[0].first - 1)]
            parts.insert(0, await before.article_part.remote(part.title, position, parts[0].first, max_chars))
        while parts[-1].open_after and parts[-1].end < self.total and _may_grow(parts, max_chars):
            after = self.shards[self.shard_of(parts[-1].end)]
            parts.append(await after.article_part.remote(part.title, position, parts[-1].end, max_chars))
        return joined_article(parts, max_chars)


def _may_grow(parts: list[ArticlePart], max_chars: int) -> bool:
    """Whether rows after ``parts`` can change their article: its text is not yet cut, or its rows are not yet
    counted to the bound."""
    chars = sum(len(t) + 1 for p in parts for t in p.texts)
    return chars <= max_chars or parts[-1].end - parts[0].first < MAX_ARTICLE_ROWS


def load_shards(shards: list[Any], settings: Settings, progress: ProgressFn) -> LoadedIndex:
    """The ingress's index loader: the encoder here, the shards' facts, and the identity ``/health`` reports."""
    from retriever_server.index.build import make_encoder

    progress("loading encoder", 0, 0)
    encoder = make_encoder(settings)
    progress("waiting for shards", 0, len(shards))
    facts = [shard.describe.remote().result() for shard in shards]
    for f in facts:
        if f["dim"] != encoder.dim:
            raise ValueError(
                f"shard {f['index']} has dimension {f['dim']} but encoder {settings.encoder_model!r} gives "
                f"{encoder.dim}; serve the encoder the index was built with (RETRIEVER_ENCODER_MODEL)"
            )
    order = sorted(range(len(shards)), key=lambda i: int(facts[i]["offset"]))
    infos = [ShardInfo.model_validate({k: facts[i][k] for k in ShardInfo.model_fields}) for i in order]
    documents = ShardDocuments([shards[i] for i in order], infos)
    return LoadedIndex(documents, ShardFanout(encoder, shards), shards_identity(facts), infos)


@serve.deployment
@serve.ingress()
class RetrieverIngress:
    """Serves the one-process server's app (every route, check and answer) over the shards."""

    def __init__(self, shards: list[Any], settings: dict[str, Any]) -> None:
        self.shards = shards
        self.settings = Settings(**settings)

    def __serve_build_asgi_app__(self) -> FastAPI:
        """Called by Ray Serve after ``__init__``: the app this replica serves."""
        return create_app(self.settings, partial(load_shards, self.shards))


def build_app(
    shards: list[ShardSpec],
    settings: Settings,
    ingress_replicas: int = 1,
    shard_replicas: int = 1,
    ingress_cpus: float = 1.0,
    shard_cpus: float = 1.0,
) -> serve.Application:
    """The Serve application: ``ingress_replicas`` encoders over ``len(shards)`` shards of ``shard_replicas`` each."""
    if not shards:
        raise ValueError("a Ray Serve retriever needs at least one shard (--shard INDEX,CORPUS)")
    conf = settings.model_copy(update={"method": Method.dense, "prebuilt_index": None}).model_dump(mode="json")
    handles = [
        IndexShard.options(  # type: ignore[attr-defined]
            name=f"IndexShard{i}", num_replicas=shard_replicas, ray_actor_options={"num_cpus": shard_cpus}
        ).bind(asdict(spec), conf)
        for i, spec in enumerate(shards)
    ]
    return RetrieverIngress.options(  # type: ignore[attr-defined,no-any-return]
        num_replicas=ingress_replicas, ray_actor_options={"num_cpus": ingress_cpus}
    ).bind(handles, conf)


def parse_shards(values: list[str]) -> list[ShardSpec]:
    """``INDEX,CORPUS[,OFFSET]`` per shard; a missing offset follows the previous shards' vector counts."""
    import faiss

    specs, offset = [], 0
    for value in values:
        parts = value.split(",")
        if len(parts) not in (2, 3):
            raise ValueError(f"--shard {value!r}: expected INDEX,CORPUS or INDEX,CORPUS,OFFSET")
        offset = int(parts[2]) if len(parts) == 3 else offset
        specs.append(ShardSpec(parts[0], parts[1], offset))
        offset += int(faiss.read_index(parts[0], faiss.IO_FLAG_MMAP_IFC).ntotal)
    return specs


def main(argv: list[str] | None = None) -> None:
    import ray

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--address", default="auto", help="Ray cluster address (ray start --head ...)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT)
    ap.add_argument("--shard", action="append", required=True, help="INDEX,CORPUS[,OFFSET]; repeat per shard")
    ap.add_argument("--ingress-replicas", type=int, default=1)
    ap.add_argument("--shard-replicas", type=int, default=1)
    ap.add_argument("--ingress-cpus", type=float, default=1.0, help="CPUs Ray reserves per encoder replica")
    ap.add_argument("--shard-cpus", type=float, default=1.0, help="CPUs Ray reserves per shard replica")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ray.init(address=args.address)
    # one HTTP proxy, on this node: nodes of one machine (tests, a laptop) cannot all bind the same port
    serve.start(http_options={"host": args.host, "port": args.port, "location": "HeadOnly"})
    application = build_app(
        parse_shards(args.shard),
        Settings(host=args.host),  # the guard accepts the bind host in the Host header
        args.ingress_replicas,
        args.shard_replicas,
        args.ingress_cpus,
        args.shard_cpus,
    )
    serve.run(application, name="retriever", route_prefix="/")
    logger.info("retriever serving on http://%s:%d (Ctrl-C stops it)", args.host, args.port)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()


if __name__ == "__main__":
    main()
