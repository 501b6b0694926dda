"""Files on disk: the model catalog, pulls and their verification, the file-hash cache,
per-pair profiles, what a name resolves to, and the provenance of results."""
