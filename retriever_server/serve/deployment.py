"""The retriever as a Ray Serve application: encoder replicas for throughput, index shards for corpora larger than a
machine, the same ``POST /retrieve`` contract outside (so the trainer's client does not change).

    ingress (FastAPI, N replicas)  encode the queries of concurrent requests in one batch (``serve.batch``)
        -> every shard (M replicas each)  search its FAISS index, return global positions and their documents
        <- merge into one top-k per query (``retrievers.sharded.merge_topk``)

A shard is an index file over consecutive corpus rows plus a corpus: either a store holding exactly those rows
(``index_convert --shards K --corpus C`` writes both), or the whole corpus (then the shard reads rows
``offset .. offset + ntotal``). Start it on a running cluster (``ray start --head`` ...)::

    python -m retriever_server.serve.deployment --address auto --port 8000 \\
        --shard e5-shard0of2.index,e5-shard0of2.store --shard e5-shard1of2.index,e5-shard1of2.store \\
        --ingress-replicas 2 --shard-replicas 1

Other settings (encoder, prefixes, nprobe, efSearch, limits) are the ``RETRIEVER_*`` variables of the CLI's shell.
"""
# No ``from __future__ import annotations`` here: Serve's class-based routes need the real annotation objects (with
# strings, FastAPI reads a ``RetrieveRequest`` body as a query parameter).

import argparse
import asyncio
import logging
import signal
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI, HTTPException
from ray import serve

from retriever_server.api.schemas import RetrieveRequest
from retriever_server.retrievers.sharded import merge_topk
from retriever_server.settings import Settings

logger = logging.getLogger(__name__)
app = FastAPI(title="search-rl retriever (Ray Serve)")


@dataclass(frozen=True)
class ShardSpec:
    """One shard: its index file, its corpus (its own rows, or the whole corpus) and its first global row."""

    index_path: str
    corpus_path: str
    offset: int


@serve.deployment
class IndexShard:
    """Searches one shard's index; answers global positions and the documents at them."""

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
        set_search_params(self.index, s.hnsw_ef_search, s.ivf_nprobe)

    def search(self, vectors: np.ndarray, topk: int) -> tuple[np.ndarray, np.ndarray, dict[int, dict[str, str]]]:
        """(scores, global positions, {global position: document}) for each query row."""
        scores, local = self.index.search(vectors, topk)
        docs = {int(p) + self.offset: self.corpus.document(int(p) + self.doc_base) for p in np.unique(local) if p >= 0}
        return scores, np.where(local >= 0, local + self.offset, -1), docs

    def describe(self) -> dict[str, Any]:
        """This replica's rows and the Ray node it runs on."""
        import ray

        return {"rows": int(self.index.ntotal), "offset": self.offset, "node": ray.get_runtime_context().get_node_id()}


@serve.deployment
@serve.ingress(app)
class RetrieverIngress:
    """Encodes queries (batched across concurrent requests), fans out to every shard, merges the top-k."""

    def __init__(self, shards: list[Any], settings: dict[str, Any]) -> None:
        from retriever_server.index.build import _make_encoder

        self.settings = Settings(**settings)
        self.encoder = _make_encoder(self.settings)
        self.shards = shards

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.005)
    async def _search(self, requests: list[tuple[list[str], int]]) -> list[list[list[tuple[dict[str, str], float]]]]:
        queries = [q for qs, _ in requests for q in qs]
        k = max(topk for _, topk in requests)
        vectors = await asyncio.to_thread(self.encoder.encode_queries, queries)  # (Q, dim)
        answers = await asyncio.gather(*(shard.search.remote(vectors, k) for shard in self.shards))
        docs: dict[int, dict[str, str]] = {}
        for _, _, shard_docs in answers:
            docs |= shard_docs
        scores, positions = merge_topk([a[0] for a in answers], [a[1] for a in answers], k)
        out, row = [], 0
        for qs, topk in requests:
            out.append(
                [
                    [
                        (docs[int(p)], float(s))
                        for p, s in zip(positions[r, :topk], scores[r, :topk], strict=True)
                        if p >= 0
                    ]
                    for r in range(row, row + len(qs))
                ]
            )
            row += len(qs)
        return out

    @app.post("/retrieve")
    async def retrieve(self, req: RetrieveRequest) -> dict[str, Any]:
        """Top-k documents per query, in Search-R1's response shape."""
        s = self.settings
        topk = req.topk if req.topk is not None else s.default_topk
        if topk > s.max_topk or len(req.queries) > s.max_queries_per_request:
            raise HTTPException(422, f"topk <= {s.max_topk} and at most {s.max_queries_per_request} queries")
        if not req.queries:
            return {"result": []}
        hits = await self._search((req.queries, topk))
        if req.return_scores:
            return {"result": [[{"document": d, "score": sc} for d, sc in row] for row in hits]}
        return {"result": [[d for d, _ in row] for row in hits]}

    @app.get("/health")
    async def health(self) -> dict[str, Any]:
        """Ready once every shard answered its size."""
        shards = await asyncio.gather(*(shard.describe.remote() for shard in self.shards))
        return {
            "status": "ready",
            "method": "dense",
            "num_documents": sum(d["rows"] for d in shards),
            "shards": shards,
            "encoder_model": self.settings.encoder_model,
        }


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
    conf = settings.model_dump(mode="json")
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
    ap.add_argument("--port", type=int, default=8000)
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
        Settings(),
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
