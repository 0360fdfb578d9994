"""The documentation is checked like code: the site builds under `mkdocs build --strict` (a broken
link, a missing anchor or a page left out of the nav fails), every InferenceService in a YAML block
renders and its objects validate, every shell block names what runs it and that holds, every
condition reason is explained, and the README stays a front page. (The generated reference page:
tests/crd/test_reference.py.)"""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass

import kubernetes_validate
import pytest
import yaml

from inference_operator.reasons import Reason
from testsupport.crd import ROOT

DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
README = ROOT / "README.md"
README_MAX_LINES = 250
K8S_VERSION = "1.33"
# A fenced block, the line before it (a marker comment, if any), its language and its text.
FENCE = re.compile(r"(?:^(?P<before>[^\n]*)\n)?^```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
RUN_BY = re.compile(r"<!-- run by: (?P<files>[^>]+?) -->")
BY_HAND = re.compile(r"<!-- by hand: [^>]+ -->")
GPU_SNIPPET = re.compile(r"<!-- render: [^>]* -->")
SHELLS = {"bash", "sh", "shell"}
# A marker that names this module means: this module runs each line itself.
THIS = "tests/test_docs.py"


@dataclass(frozen=True)
class Block:
    source: pathlib.Path
    lang: str
    before: str
    body: str

    @property
    def where(self) -> str:
        return f"{self.source.relative_to(ROOT)}: ```{self.lang} {self.body.splitlines()[0][:60] if self.body else ''}"


def blocks(path: pathlib.Path) -> list[Block]:
    return [
        Block(path, m["lang"], m["before"] or "", m["body"]) for m in FENCE.finditer(path.read_text(encoding="utf-8"))
    ]


def all_blocks() -> list[Block]:
    return [block for path in [README, *PAGES] for block in blocks(path)]


def commands(block: Block) -> list[str]:
    """A shell block's command lines, without comments."""
    lines = [line.split(" #", 1)[0].strip() for line in block.body.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def run_by_ci() -> set[str]:
    """The scripts CI runs: .ci/run and every `bash scripts/X.sh` they call, transitively."""
    seen: set[str] = set()
    todo = [".ci/run"]
    while todo:
        name = todo.pop()
        if name in seen or not (ROOT / name).is_file():
            continue
        seen.add(name)
        todo += re.findall(r"\bbash (scripts/[\w-]+\.sh)\b", (ROOT / name).read_text())
    return seen


def build_site(config: pathlib.Path, out: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(out)],
        cwd=config.parent,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("site")
    result = build_site(ROOT / "mkdocs.yml", out)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


# --- the site


def test_the_site_builds_strict(site: pathlib.Path) -> None:
    """Every page of docs/ is built, from the nav (an omitted page fails the strict build)."""
    built = {p.parent.name if p.parent != site else "index" for p in site.rglob("index.html")}
    assert {p.stem for p in PAGES} <= built


def _copy_site_sources(tmp_path: pathlib.Path) -> pathlib.Path:
    shutil.copytree(DOCS, tmp_path / "docs")
    for name in ("mkdocs.yml", "CONTRIBUTING.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path / "mkdocs.yml"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (
            lambda docs: (docs / "canary.md").open("a").write("\n[steps](autoscaling.md#no-such-heading)\n"),
            "no-such-heading",
        ),
        (lambda docs: (docs / "canary.md").open("a").write("\n[gone](no-such-page.md)\n"), "no-such-page.md"),
        (lambda docs: (docs / "orphan.md").write_text("# Orphan\n"), "orphan.md"),
    ],
    ids=["missing-anchor", "broken-link", "page-not-in-nav"],
)
def test_a_broken_site_fails_the_strict_build(tmp_path: pathlib.Path, change: object, named: str) -> None:
    config = _copy_site_sources(tmp_path)
    change(tmp_path / "docs")  # type: ignore[operator]
    result = build_site(config, tmp_path / "out")
    assert result.returncode != 0
    assert named in result.stdout + result.stderr


def test_the_architecture_page_shows_the_contributing_map(site: pathlib.Path) -> None:
    """The module map has one source, CONTRIBUTING.md; the site includes it."""
    html = (site / "architecture" / "index.html").read_text()
    assert "jsontypes.py" in html and "status_pods.py" in html


# --- the README, a front page


def test_the_readme_is_a_front_page() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; topics go to docs/"


# A running time, a ratio, a share or a rate in prose: figures go to docs/benchmarks.md.
FIGURE = re.compile(
    r"\b\d[\d,.]*\s*(?:-\s*\d[\d,.]*\s*)?(?:ms|s|sec|seconds?|min|minutes?|h|hours?|x|×|%|rps|req/s|rows/s)(?![\w/])"
    r"|\b\d[\d.]*x\b"
)


def _prose(text: str) -> str:
    return FENCE.sub("", text)


def test_the_readme_has_no_measured_figures() -> None:
    found = FIGURE.findall(_prose(README.read_text()))
    assert found == [], f"measured figures belong in docs/benchmarks.md: {found}"


def test_the_figure_guard_finds_a_figure() -> None:
    assert FIGURE.findall(_prose("The suite takes 13-15 minutes; 1.04-2.57x faster; 96% busy.\n"))
    assert not FIGURE.findall(_prose("Python 3.11+, on 127.0.0.1.\n```\nmaxDelayMs: 5 s\n```\n"))


def _nav_pages() -> list[str]:
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]

    def walk(node: object) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, list):
            return [page for item in node for page in walk(item)]
        if isinstance(node, dict):
            return [page for value in node.values() for page in walk(value)]
        return []

    return walk(nav)


def test_the_readme_links_every_topic_page_and_its_links_resolve(site: pathlib.Path) -> None:
    text = README.read_text()
    links = re.findall(r"\]\((?!https?:)([^)#\s]+)(?:#([^)\s]+))?\)", text)
    linked = {target for target, _ in links}
    missing = [page for page in _nav_pages() if page != "index.md" and f"docs/{page}" not in linked]
    assert missing == [], f"README.md does not link: {missing}"
    for target, anchor in links:
        assert (ROOT / target).exists(), f"README.md links {target}, which does not exist"
        if anchor and target.startswith("docs/"):
            html = (site / pathlib.Path(target).stem / "index.html").read_text()
            assert f'id="{anchor}"' in html, f"README.md links {target}#{anchor}: no such anchor"


# --- YAML blocks: every InferenceService renders, and what it becomes validates


def yaml_blocks() -> list[Block]:
    return [b for b in all_blocks() if b.lang == "yaml"]


def test_every_yaml_block_is_an_inference_service_or_a_rendered_snippet() -> None:
    """A YAML block in the docs is either an InferenceService (rendered below) or the output of
    `render --gpu-view` (checked by scripts/docs_gpu_view.py --check): nothing goes unchecked."""
    unchecked = [
        b.where
        for b in yaml_blocks()
        if not GPU_SNIPPET.search(b.before) and (yaml.safe_load(b.body) or {}).get("kind") != "InferenceService"
    ]
    assert unchecked == []


SERVICES = [b for b in yaml_blocks() if not GPU_SNIPPET.search(b.before)]


def _service_id(block: Block) -> str:
    document = yaml.safe_load(block.body)
    name = document.get("metadata", {}).get("name", "?") if isinstance(document, dict) else "?"
    return f"{block.source.name}:{name}"


@pytest.mark.parametrize("block", SERVICES, ids=_service_id)
def test_every_inference_service_in_the_docs_renders(block: Block) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "inference_operator", "render", "-f", "-"],
        input=block.body,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"{block.where}\n{result.stderr}"
    objects = [o for o in yaml.safe_load_all(result.stdout) if o]
    assert objects, block.where
    validated = 0
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
            validated += 1
        except kubernetes_validate.SchemaNotFoundError:
            continue  # an add-on's kind (KEDA, Gateway API): the builder tests check those
    assert validated, block.where


# --- shell blocks: each names what runs it


def shell_blocks() -> list[Block]:
    return [b for b in all_blocks() if b.lang in SHELLS]


def test_every_shell_block_names_what_runs_it() -> None:
    """A shell block to run names, in a comment before it, the files of the suite that run each of
    its lines: the scripts CI runs (.ci/run and what it calls) or a test module; or it says it is
    run by hand and why (the benchmarks). Each line must be in one of the files it names, as is."""
    ci = run_by_ci()
    problems: list[str] = []
    for block in shell_blocks():
        marker = RUN_BY.search(block.before)
        if marker is None:
            if not BY_HAND.search(block.before):
                problems.append(f"{block.where}: no <!-- run by: FILES --> or <!-- by hand: WHY --> before it")
            continue
        files = [f.strip() for f in marker["files"].split(",")]
        for name in files:
            if name not in ci and not (name.startswith("tests/") and (ROOT / name).is_file()):
                problems.append(f"{block.where}: {name} is neither run by CI nor a test module")
        texts = [(ROOT / name).read_text() for name in files if (ROOT / name).is_file() and name != THIS]
        for line in commands(block):
            if THIS not in files and not any(line in text for text in texts):
                problems.append(f"{block.where}: `{line}` is in none of {files}")
    assert problems == []


RUN_HERE = [
    (b, line) for b in shell_blocks() if (m := RUN_BY.search(b.before)) and THIS in m["files"] for line in commands(b)
]


@pytest.mark.parametrize(("block", "line"), RUN_HERE, ids=[line for _, line in RUN_HERE])
def test_the_shell_lines_the_docs_give_run(block: Block, line: str) -> None:
    argv = shlex.split(line)
    assert argv[0] == "python", f"{block.where}: this test runs python commands only"
    result = subprocess.run(
        [sys.executable, *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, f"{block.where}: `{line}`\n{result.stdout[-2000:]}{result.stderr[-2000:]}"


def test_the_shell_check_finds_a_line_no_file_runs(tmp_path: pathlib.Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- run by: .ci/run -->\n```bash\nbash scripts/test.sh\nbash scripts/deploy.sh\n```\n")
    (block,) = blocks(page)
    text = (ROOT / ".ci/run").read_text()
    assert [line for line in commands(block) if line not in text] == ["bash scripts/deploy.sh"]
    assert ".ci/run" in run_by_ci() and "scripts/test.sh" in run_by_ci()


# --- troubleshooting: every reason the operator writes is explained


def test_operations_explains_every_reason() -> None:
    text = (DOCS / "operations.md").read_text()
    table = text[text.index("### Every reason") :]
    rows = {
        name
        for line in table.splitlines()
        if line.startswith("| `")
        for name in re.findall(r"`(\w+)`", line.split("|")[1])
    }
    missing = sorted(reason.value for reason in Reason if reason.value not in rows)
    assert missing == [], f"docs/operations.md does not explain: {missing}"
