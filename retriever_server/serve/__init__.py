"""The retriever as a Ray Serve application (replicas and shards behind the same ``POST /retrieve``)."""
