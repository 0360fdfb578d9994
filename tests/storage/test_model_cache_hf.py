"""A destination on a cache claim holds only what the Hub publishes for the commit.

The attack: a second service with the same hf://org/name and its own mirror as endpoint (the
mirror reports the real commit) fetched first into the shared directory, leaving a same-size
config.json of its own and an extra file; the victim's fetch then served both without a single
download. Now every cached file is checked against the digest the victim's endpoint publishes
(an LFS file's sha256, a small file's git blob id), anything the commit does not name is
removed, and a download whose bytes differ from the published digest is refused.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from model_fetcher.errors import ExitCode
from tests.storage.test_model_fetch_hf import COMMIT, FILES, Hub, model_files, run_fetch, running_hub

PLANTED_CONFIG = b'{"model_type": "evil!"}'  # the same size as the real config.json
PLANTED_EXTRA = {"modeling_evil.py": b"import os; os.system('id')\n", "tokenizer/added.json": b"{}"}


def test_a_mirror_planted_file_of_the_same_size_is_replaced_and_extra_files_removed(
    hub: Hub, tmp_path: pathlib.Path
) -> None:
    assert len(PLANTED_CONFIG) == len(FILES["config.json"])
    dest = tmp_path / "claim" / "hf" / "org" / "tiny"  # one directory for both, as the URI-only key had it
    with running_hub({**FILES, "config.json": PLANTED_CONFIG, **PLANTED_EXTRA}) as mirror:
        planted = run_fetch(mirror, "hf://org/tiny@main", dest)
    assert planted.returncode == 0, planted.stderr
    assert model_files(dest)["config.json"] == PLANTED_CONFIG

    victim = run_fetch(hub, "hf://org/tiny@main", dest)
    assert victim.returncode == 0, victim.stderr
    assert model_files(dest) == FILES  # the mirror's config.json replaced, its extra files gone
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == sorted(FILES)
    # Only what did not match the Hub's digests was downloaded again.
    assert hub.resolves("GET") == [f"/org/tiny/resolve/{COMMIT}/config.json"]
    assert "modeling_evil.py" in victim.stderr  # the removal is logged


def test_a_download_that_does_not_match_the_published_digest_is_refused(hub: Hub, tmp_path: pathlib.Path) -> None:
    """An LFS file checked against its sha256, a small file against its git blob id: same-size
    bytes from the endpoint (or anything between it and the pod) are not served."""
    weights = FILES["model.safetensors"]
    for name, tampered in [("model.safetensors", weights[::-1]), ("config.json", PLANTED_CONFIG)]:
        hub.served = {name: tampered}
        dest = tmp_path / name
        result = run_fetch(hub, "hf://org/tiny", dest)
        assert result.returncode == ExitCode.CHECKSUM, result.stderr
        assert ("sha256" if name.endswith(".safetensors") else "git blob id") in result.stderr
        assert "Traceback" not in result.stderr
        assert not (dest / name).exists()
        assert model_files(dest) == {n: d for n, d in FILES.items() if n != name}  # the others passed
        # Next time the file is there and right: only it is downloaded.
        hub.served, hub.requests = {}, []
        assert run_fetch(hub, "hf://org/tiny", dest).returncode == 0
        assert hub.resolves("GET") == [f"/org/tiny/resolve/{COMMIT}/{name}"]
        assert model_files(dest) == FILES


def test_a_planted_symbolic_link_is_removed_not_followed(hub: Hub, tmp_path: pathlib.Path) -> None:
    dest, elsewhere = tmp_path / "models", tmp_path / "elsewhere"
    dest.mkdir()
    elsewhere.mkdir()
    (dest / "tokenizer").symlink_to(elsewhere)  # the directory of tokenizer/tokenizer.json
    (dest / "config.json").symlink_to(elsewhere / "config.json")
    (elsewhere / "config.json").write_bytes(FILES["config.json"])
    result = run_fetch(hub, "hf://org/tiny", dest)
    assert result.returncode == 0, result.stderr
    assert not (dest / "tokenizer").is_symlink() and not (dest / "config.json").is_symlink()
    assert model_files(dest) == FILES
    assert [p.name for p in elsewhere.iterdir()] == ["config.json"]  # nothing written through the links


def test_replicas_fetching_at_once_take_turns_and_download_once(hub: Hub, tmp_path: pathlib.Path) -> None:
    """Two init containers on one claim: one waits for the other's lock, then finds every file
    verified. Without the lock, one would remove or replace what the other is writing."""
    hub.files["model-2.safetensors"] = os.urandom(4 << 20)
    expected = dict(hub.files)
    dest = tmp_path / "models"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MODEL_FETCH_"))}
    env |= {"HF_ENDPOINT": hub.url, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "model_server.storage", "hf://org/tiny", str(dest)]
    replicas = [subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in replicas]
    assert [code for code, _ in results] == [0, 0], results
    assert sorted(hub.resolves("GET")) == sorted(f"/org/tiny/resolve/{COMMIT}/{n}" for n in expected)
    assert model_files(dest) == expected


def test_a_file_listed_with_nothing_to_check_it_against_is_downloaded_each_time(
    hub: Hub, tmp_path: pathlib.Path
) -> None:
    """A Xet-stored file listed without its LFS sha256: its blob id is a pointer's, not the
    content's, so it proves nothing; the file is fetched again rather than trusted or refused."""
    hub.xet_only = {"model.safetensors"}
    dest = tmp_path / "models"
    assert run_fetch(hub, "hf://org/tiny", dest).returncode == 0
    assert len(hub.resolves("GET")) == len(FILES)
    hub.requests.clear()
    again = run_fetch(hub, "hf://org/tiny", dest)
    assert again.returncode == 0, again.stderr
    assert hub.resolves("GET") == [f"/org/tiny/resolve/{COMMIT}/model.safetensors"]
    assert model_files(dest) == FILES
