"""Where a source's bytes come from: local files, URLs by range requests, buckets read at the
version that was opened, and the Hub pinned to a commit. The formats beside this folder
(safetensors, GGUF, orbax) parse what these read."""
