"""The history says why: every commit since the rule was set has a subject of at most 72
characters and a body (CONTRIBUTING, "Commits"). Merges too: a merge says what it brings.

Commits before SINCE are left as they landed; history is not rewritten."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The last commit before the rule was checked here.
SINCE = "8460135"
SUBJECT_LIMIT = 72
SEPARATOR = "\x1e"


def git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False)


def commits_since(base: str) -> list[tuple[str, str, str]]:
    """(hash, subject, body) of each commit after `base` on HEAD's history."""
    log = git("log", f"--format=%h%x1f%s%x1f%b{SEPARATOR}", f"{base}..HEAD")
    assert log.returncode == 0, log.stderr
    found = []
    for record in log.stdout.split(SEPARATOR):
        if record.strip():
            sha, subject, body = record.strip("\n").split("\x1f", 2)
            found.append((sha, subject, body))
    return found


def problems(commits: list[tuple[str, str, str]]) -> list[str]:
    found = []
    for sha, subject, body in commits:
        if len(subject) > SUBJECT_LIMIT:
            found.append(f"{sha}: subject of {len(subject)} characters (at most {SUBJECT_LIMIT}): {subject}")
        if not body.strip():
            found.append(f"{sha}: no body saying why: {subject}")
    return found


def test_the_rule_finds_a_long_subject_and_a_missing_body() -> None:
    assert problems([("a", "x" * 73, "why"), ("b", "short", "  \n"), ("c", "x" * 72, "why")]) == [
        f"a: subject of 73 characters (at most 72): {'x' * 73}",
        "b: no body saying why: short",
    ]


def test_every_commit_since_the_rule_has_a_short_subject_and_a_body() -> None:
    if shutil.which("git") is None or git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout")
    if git("cat-file", "-e", f"{SINCE}^{{commit}}").returncode != 0:
        pytest.skip(f"history before {SINCE} is not here (a shallow clone)")
    assert problems(commits_since(SINCE)) == []
