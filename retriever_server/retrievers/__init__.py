"""Retrieval backends: dense (FAISS over sentence-transformers), BM25 (bm25s) and their hybrid."""
