"""hf://ORG/NAME[@REVISION] through huggingface_hub, against a stand-in of the Hub's HTTP API.

The stand-in answers the calls huggingface_hub makes for a plain (non-Xet) repository: the
revision's commit, the recursive file tree, and HEAD/GET of each file under /resolve/. Not
covered offline: Xet-stored files (huggingface_hub then talks to a separate CAS service) and
the real Hub's redirects of large files to its CDN.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from model_fetcher.errors import ExitCode
from model_fetcher.uris import parse_hf
from tests.http_stub import QuietHandler, serving
from tests.storage.fetch_failures import fetch_fails

COMMIT = "0123456789abcdef0123456789abcdef01234567"
FILES = {
    "config.json": b'{"model_type": "llama"}',
    "model.safetensors": bytes(range(256)) * 40,
    "tokenizer/tokenizer.json": b"{}",
}

pytest.importorskip("huggingface_hub")


@dataclass
class Hub:
    url: str
    files: dict[str, bytes]
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    commit: str = COMMIT  # what the revision resolves to (a hostile Hub may name anything)
    declared: dict[str, int] = field(default_factory=dict)  # sizes the tree claims, if not the real ones
    others: dict[str, dict[str, bytes]] = field(default_factory=dict)  # more repositories, by id
    served: dict[str, bytes] = field(default_factory=dict)  # bytes sent instead of a file's own (tampering)
    xet_only: set[str] = field(default_factory=set)  # files the tree lists with a xetHash and no lfs entry

    def repo(self, repo_id: str) -> dict[str, bytes] | None:
        return self.files if repo_id == "org/tiny" else self.others.get(repo_id)

    def resolves(self, method: str) -> list[str]:
        return [path for m, path, _ in self.requests if m == method and "/resolve/" in path]


LFS_SUFFIXES = (".safetensors", ".bin", ".gguf")  # what a repository's .gitattributes sends to LFS


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def tree_entry(name: str, data: bytes, size: int) -> dict:
    """A file as the Hub's tree API lists it: git's blob id, and for an LFS file the pointer's
    blob id with the content's sha256 under `lfs`."""
    if not name.endswith(LFS_SUFFIXES):
        return {"type": "file", "oid": git_blob_id(data), "size": size, "path": name}
    sha256 = hashlib.sha256(data).hexdigest()
    pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()
    lfs = {"oid": sha256, "size": size, "pointerSize": len(pointer)}
    return {"type": "file", "oid": git_blob_id(pointer), "size": size, "path": name, "lfs": lfs}


@pytest.fixture
def hub() -> Iterator[Hub]:
    with running_hub(dict(FILES)) as state:
        yield state


@contextlib.contextmanager
def running_hub(files: dict[str, bytes]) -> Iterator[Hub]:
    """A stand-in Hub on loopback serving `files` as org/tiny at COMMIT."""
    state = Hub("", files)

    class Handler(QuietHandler):
        def do_HEAD(self) -> None:
            self.answer(body=False)

        def do_GET(self) -> None:
            self.answer(body=True)

        def answer(self, body: bool) -> None:
            path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
            state.requests.append((self.command, path, self.headers.get("Authorization")))
            api = re.match(rf"^/api/models/([^/]+/[^/]+)/(revision/.*|tree/{COMMIT})$", path)
            files = state.repo(api[1]) if api else None
            if api and files is not None and api[2].startswith("revision/"):
                info = {"id": api[1], "sha": state.commit, "siblings": [{"rfilename": f} for f in files]}
                return self.reply(json.dumps(info).encode())
            if api and files is not None:
                tree = [tree_entry(name, data, state.declared.get(name, len(data))) for name, data in files.items()]
                for entry in tree:
                    if entry["path"] in state.xet_only:
                        entry |= {"oid": git_blob_id(b"a pointer"), "xetHash": "ab" * 32}
                        entry.pop("lfs", None)
                return self.reply(json.dumps(tree).encode())
            resolve = re.match(rf"^/([^/]+/[^/]+)/resolve/{COMMIT}/(.+)$", path)
            files = state.repo(resolve[1]) if resolve else None
            if resolve and files is not None and resolve[2] in files:
                data = state.served.get(resolve[2], files[resolve[2]])
                self.send_response(200)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Content-Type", "application/octet-stream")
                self.end_headers()
                if body and path.endswith("slow.bin"):  # one byte every half second
                    try:
                        for byte in data:
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                            time.sleep(0.5)
                    except OSError:
                        pass
                elif body:
                    self.wfile.write(data)
                return
            self.reply(b'{"error": "Repository not found"}', status=404)

    with serving(Handler) as server:
        state.url = f"http://127.0.0.1:{server.server_address[1]}"
        yield state


def run_fetch(
    hub: Hub, uri: str, dest: pathlib.Path, *flags: str, allow_http_token: bool = True
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MODEL_FETCH_"))}
    env |= {"HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_test_token", "PYTHONPATH": os.pathsep.join(sys.path)}
    if allow_http_token:  # the stand-in speaks plain http on loopback
        env["MODEL_FETCH_ALLOW_HTTP_TOKEN"] = "true"
    return subprocess.run(
        [sys.executable, "-m", "model_server.storage", uri, str(dest), *flags],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def model_files(dest: pathlib.Path) -> dict[str, bytes]:
    return {
        p.relative_to(dest).as_posix(): p.read_bytes()
        for p in dest.rglob("*")
        if p.is_file() and ".cache" not in p.relative_to(dest).parts
    }


def test_hf_repo_lands_whole_with_the_token_and_is_not_fetched_twice(hub: Hub, tmp_path: pathlib.Path) -> None:
    dest = tmp_path / "models"
    result = run_fetch(hub, "hf://org/tiny@main", dest)
    assert result.returncode == 0, result.stderr
    assert model_files(dest) == FILES
    assert "/api/models/org/tiny/revision/main" in [p for _, p, _ in hub.requests]
    assert {auth for _, path, auth in hub.requests if path.startswith(("/api/models", "/org/"))} == {
        "Bearer hf_test_token"
    }
    assert sorted(hub.resolves("GET")) == sorted(f"/org/tiny/resolve/{COMMIT}/{name}" for name in FILES)

    # A second replica on the same volume: the files are there, nothing is downloaded again.
    hub.requests.clear()
    again = run_fetch(hub, "hf://org/tiny@main", dest)
    assert again.returncode == 0, again.stderr
    assert hub.resolves("GET") == []
    assert model_files(dest) == FILES


def test_hf_revision_is_asked_for(hub: Hub, tmp_path: pathlib.Path) -> None:
    result = run_fetch(hub, "hf://org/tiny@v1.0", tmp_path / "models")
    assert result.returncode == 0, result.stderr
    assert "/api/models/org/tiny/revision/v1.0" in [p for _, p, _ in hub.requests]


@pytest.mark.parametrize("name", ["../escape.bin", "/etc/cron.d/x", "a/../../x"])
def test_hf_paths_leaving_the_destination_download_nothing(hub: Hub, tmp_path: pathlib.Path, name: str) -> None:
    hub.files[name] = b"owned"
    result = run_fetch(hub, "hf://org/tiny", tmp_path / "models")
    assert result.returncode == ExitCode.UNSAFE, result.stderr
    assert hub.resolves("GET") == [] and hub.resolves("HEAD") == []
    assert not (tmp_path / "escape.bin").exists()


def test_hf_size_cap_is_checked_before_downloading(hub: Hub, tmp_path: pathlib.Path) -> None:
    result = run_fetch(hub, "hf://org/tiny", tmp_path / "models", "--max-bytes", "5000")
    assert result.returncode == ExitCode.TOO_LARGE, result.stderr
    assert "size cap" in result.stderr
    assert hub.resolves("GET") == []


def test_hf_unknown_repo_is_a_source_error(hub: Hub, tmp_path: pathlib.Path) -> None:
    result = run_fetch(hub, "hf://org/missing", tmp_path / "models")
    assert result.returncode == ExitCode.SOURCE, result.stderr
    assert "hf://org/missing" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("uri", ["hf://justaname", "hf://org/name/extra", "hf://org/name@../x", "hf://../x", "hf://"])
def test_hf_bad_uris_are_usage_errors(uri: str) -> None:
    with fetch_fails(ExitCode.USAGE):
        parse_hf(uri)


def test_hf_uri_parts() -> None:
    assert parse_hf("hf://meta-llama/Llama-3.1-8B-Instruct") == ("meta-llama/Llama-3.1-8B-Instruct", "main")
    assert parse_hf("hf://org/name@refs/pr/1") == ("org/name", "refs/pr/1")
    assert parse_hf(f"hf://org/name@{COMMIT}") == ("org/name", COMMIT)


def test_hf_token_is_not_sent_to_a_plain_http_endpoint(hub: Hub, tmp_path: pathlib.Path) -> None:
    result = run_fetch(hub, "hf://org/tiny", tmp_path / "models", allow_http_token=False)
    assert result.returncode == ExitCode.UNSAFE, result.stderr
    assert "HF_TOKEN" in result.stderr and "hf_test_token" not in result.stderr
    assert hub.requests == []


def test_hf_download_ends_at_the_deadline(hub: Hub, tmp_path: pathlib.Path) -> None:
    """The Hub library downloads in threads of its own; the deadline still ends the fetch, with
    its exit code, long before the file (five minutes at one byte per half second) or the run's
    bound would."""
    hub.files["slow.bin"] = b"x" * 600
    result = run_fetch(hub, "hf://org/tiny", tmp_path / "models", "--deadline", "3")
    assert result.returncode == ExitCode.DEADLINE, result.stderr
    assert not (tmp_path / "models" / "slow.bin").exists()


def test_a_commit_that_is_no_sha_is_refused_before_anything_is_written(hub: Hub, tmp_path: pathlib.Path) -> None:
    """A hostile endpoint's commit becomes a path: ../../../../tmp/x wrote outside the model directory."""
    hub.commit = "../../../../" + str(tmp_path / "escaped").lstrip("/")
    done = run_fetch(hub, "hf://org/tiny", tmp_path / "models")
    assert done.returncode == ExitCode.UNSAFE, done.stderr
    assert "40-digit hex sha" in done.stderr
    assert not (tmp_path / "escaped").exists()
    assert not hub.resolves("GET")


def test_a_file_larger_than_declared_is_stopped_at_the_cap(hub: Hub, tmp_path: pathlib.Path) -> None:
    """The tree says 10 bytes, the file sends 5 MiB: --max-bytes 1Mi held only the declared sizes."""
    hub.files["model.safetensors"] = bytes(5 << 20)
    hub.declared["model.safetensors"] = 10
    done = run_fetch(hub, "hf://org/tiny", tmp_path / "models", "--max-bytes", "1Mi")
    assert done.returncode == ExitCode.TOO_LARGE, done.stderr
    assert not (tmp_path / "models" / "model.safetensors").exists()  # nothing of it is kept
