"""Index building: the corpus and its memory-mapped store, FAISS/BM25 builds and conversions, shipped embeddings."""
