"""Fetch a model into a local directory: the job of the pod's `model-fetch` init container.

    python -m model_server.storage https://host/models/resnet/model.onnx /mnt/models
    python -m model_server.storage s3://bucket/models/resnet /mnt/models
    python -m model_server.storage hf://meta-llama/Llama-3.1-8B-Instruct@main /mnt/models

An HTTP(S) URI names one model file, saved under its own name (the server treats a lone model
file as version 1). An S3 URI names one object, or a "directory" (with or without the trailing
`/`; `models/resnet` never matches `models/resnet-private/`) whose objects are copied with their
relative paths, so a repository laid out as `<version>/model.onnx` arrives as such. An
`hf://ORG/NAME[@REVISION]` URI is a Hugging Face Hub model repository at a branch, tag or commit
(default `main`), copied whole with `huggingface_hub`. Files are written to a temporary name and
renamed, so the server never sees half a model.

Hostile or broken sources are refused, never followed:
- every written path stays inside the destination (no absolute, `.` or `..` parts);
- HTTP redirects only to https on the same host (or http to https); other hosts only when
  listed (`--allow-redirect-host`); never from https down to http;
- a size cap on the whole fetch and an overall deadline, however slowly the bytes trickle;
- `text/html` answers and files that start like an HTML page are not models;
- `--sha256` (one file) or `<file>.sha256` objects beside S3 files (hex digest, sha256sum
  format accepted) are checked before the rename.

Options (each also an environment variable, which the operator's init container can set):

    --sha256 HEX                  MODEL_FETCH_SHA256            expected digest of the one file
    --max-bytes N[Ki|Mi|Gi|Ti]    MODEL_FETCH_MAX_BYTES         default 200Gi
    --deadline SECONDS            MODEL_FETCH_DEADLINE_SECONDS  default 3600
    --allow-redirect-host HOST    MODEL_FETCH_REDIRECT_HOSTS    comma-separated
                                  MODEL_FETCH_ALLOW_HTTP_TOKEN  send HF_TOKEN to a plain-http HF_ENDPOINT
                                  MODEL_FETCH_CA_BUNDLE         PEM certificates trusted besides the
                                                                public roots (a platform's own CA)
                                  MODEL_FETCH_TERMINATION_LOG   a file for one line on why the fetch
                                                                failed (the pod's terminationMessagePath)

Credentials: S3 from the usual AWS_* variables (needs `boto3`, the `s3` extra); the Hub from
HF_TOKEN (a token for private or gated repositories) and HF_ENDPOINT (a mirror's URL, default
https://huggingface.co; the token goes only to an https endpoint).

A destination may be a cache claim's directory that outlives the pod (shared by replicas): a
fetch takes an flock on `.cache/model-fetch.lock` in it, removes every file the source does not
name, keeps a file already there only when it matches the digest the source publishes (the
Hub's sha256 of an LFS file or git blob id of a small one; S3's full-object ChecksumSHA256, an
MD5 ETag or a `.sha256` object), downloads the rest and refuses a download that does not match.

Exit codes: 0 fetched; 1 the source failed (HTTP error, unreachable, no such object or repo);
2 bad arguments or URI; 3 refused as unsafe (a path leaving the destination, a redirect not
allowed); 4 not a model (HTML); 5 over the size cap; 6 past the deadline; 7 checksum mismatch;
8 local I/O error (disk full, read-only destination).

The modules, one concern each: errors.py (exit codes, FetchError), limits.py (what one fetch may
cost), files.py (paths kept inside the destination, one file written and checked), cache.py
(the destination as a shared cache: its lock, what is pruned, what is kept), uris.py (the three
URI forms), web.py, s3.py and hub.py (the sources), fetching.py (`fetch`, by scheme), trust.py
(a platform's CA), cli.py (the command line) and __main__.py. This file imports nothing:
`python -m model_server.storage` runs it before __main__.py's SIGTERM handler is in place.
"""
