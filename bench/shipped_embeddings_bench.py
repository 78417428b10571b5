"""Search quality with the shipped float16 embeddings vs the float32 ones they were rounded from.

Both are searched with FAISS Flat (inner product) and the same encoded queries: the 600 questions of the shipped
test split (``data/datasets/nq_hotpotqa_mini/test.parquet``). Reports recall@1/@3 of the NQ questions' gold
passages (``data/datasets/gold_passages.jsonl``) with each, how often the top-1 and the top-3 lists are identical,
and how far the vectors moved. The float32 index is the one ``--export-shipped`` leaves in the cache:

    python -m retriever_server.index.build --corpus data/corpus/wiki_mini.jsonl.gz --method dense \\
        --out /tmp/fp32-cache --export-shipped data/index/wiki_mini
    python bench/shipped_embeddings_bench.py --float32-index-dir /tmp/fp32-cache

Last line: ``shipped_embeddings_bench top1_same=<x> top3_same=<y> recall3_f16=<a> recall3_f32=<b>``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import faiss
import numpy as np

from data_prep.build_default_dataset import DEFAULT_OUT, GOLD_FILE
from data_prep.rows import read_rows
from retriever_server.index.build import index_path
from retriever_server.index.corpus import load_corpus
from retriever_server.index.shipped_embeddings import find_set, load_set
from retriever_server.retrievers.encoder import Encoder
from retriever_server.settings import SHIPPED_CORPUS, Method, Settings

TEST_SPLIT = "nq_hotpotqa_mini/test.parquet"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--float32-index-dir", type=Path, required=True, help="index cache holding the encoded index")
    args = ap.parse_args()
    corpus = load_corpus(SHIPPED_CORPUS)
    settings = Settings(index_dir=args.float32_index_dir, show_progress=False)
    folder = index_path(corpus, Method.dense, settings)
    meta = json.loads((folder / "meta.json").read_text())
    if not str(meta.get("embeddings", "")).startswith("encoded by"):
        raise SystemExit(f"{folder} was not built by encoding ({meta.get('embeddings')}); see the module docstring")
    f32_index = faiss.read_index(str(folder / "index.faiss"))
    f32 = f32_index.reconstruct_n(0, f32_index.ntotal)
    encoder = Encoder(settings.encoder_model)
    shipped = find_set(corpus)
    if shipped is None:
        raise SystemExit("no shipped embeddings for the shipped corpus under data/index")
    f16 = load_set(shipped, corpus, settings, encoder)
    f16_index = faiss.IndexFlatIP(f16.shape[1])
    f16_index.add(f16)

    rows = read_rows(DEFAULT_OUT / TEST_SPLIT)
    with (DEFAULT_OUT / GOLD_FILE).open() as f:
        gold = {g["id"]: g["corpus_ids"] for g in map(json.loads, f) if g["file"] == TEST_SPLIT}
    position = {doc_id: i for i, doc_id in enumerate(corpus.ids)}
    queries = encoder.encode_queries([r["question"] for r in rows])
    _, top16 = f16_index.search(queries, 3)
    _, top32 = f32_index.search(queries, 3)
    nq = [i for i, r in enumerate(rows) if r["data_source"] == "nq"]
    nq_gold = np.array([position[gold[rows[i]["extra_info"]["id"]][0]] for i in nq])

    def recall(top: np.ndarray, k: int) -> float:
        return float((top[nq, :k] == nq_gold[:, None]).any(axis=1).mean())

    cosine = (f16 * f32).sum(axis=1)
    top1_same = float((top16[:, 0] == top32[:, 0]).mean())
    top3_same = float((top16 == top32).all(axis=1).mean())
    top3_set = float(np.mean([set(a) == set(b) for a, b in zip(top16.tolist(), top32.tolist(), strict=True)]))
    print(f"vectors: {len(f16)}; cosine(float16, float32) min {cosine.min():.7f} mean {cosine.mean():.7f}")
    print(
        f"{len(rows)} test questions: top-1 identical {top1_same:.4f}, top-3 identical (in order) {top3_same:.4f}, "
        f"top-3 same set {top3_set:.4f}"
    )
    for name, top in (("float16 (shipped)", top16), ("float32 (encoded)", top32)):
        print(f"{name}: NQ recall@1 {recall(top, 1):.4f} recall@3 {recall(top, 3):.4f} over {len(nq)} questions")
    print(
        f"shipped_embeddings_bench top1_same={top1_same:.4f} top3_same={top3_same:.4f} "
        f"recall3_f16={recall(top16, 3):.4f} recall3_f32={recall(top32, 3):.4f}"
    )


if __name__ == "__main__":
    main()
