"""The repository stands alone: every relative link and file reference in its documents and
sources resolves to a file in the repository, so a reader never meets a pointer to a document
that only some developers have."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from fleetwatch.rules.config import load_config

ROOT = Path(__file__).resolve().parents[1]

# [text](target) in Markdown; the target's #anchor is not a file.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# `rules/config.yaml`, `docs/deploy.md`: a code span that names a file of the repository.
CODE_SPAN = re.compile(r"`([^`\s]+)`")
REPO_FILE = re.compile(r"^[\w.-]+(/[\w.-]+)*\.(md|py|yaml|yml|json|toml|sh|txt|proto|cfg)$")
# A mention of a Markdown document in a source file or a document (URLs excluded): a path
# (`docs/tainter.md`, `notes/nvml.md`) or a capitalised name (`ARCHITECTURE.md`). Bare
# lowercase names are output files (`summary.md`) or path parts joined in code.
MARKDOWN_MENTION = re.compile(
    r"(?<![\w/.:-])((?:\.\./|\./)?(?:[\w.-]+/)+[\w.-]+\.md|[A-Z][A-Z0-9_-]*\.md)\b"
)
URL = re.compile(r"\bhttps?://\S+")


def tracked(*patterns: str) -> list[Path]:
    """Files git tracks (or would track: untracked but not ignored) matching `patterns`."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *patterns],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [ROOT / name for name in listed if (ROOT / name).is_file()]


def documents() -> list[Path]:
    return tracked("*.md")


def resolves(reference: str, source: Path) -> bool:
    """Whether `reference` names a file or folder relative to its document or the root."""
    target = reference.split("#", 1)[0]
    if not target:
        return True  # an anchor in the same document
    return any((base / target).exists() for base in (source.parent, ROOT))


def broken_references(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        if not resolves(target, path):
            broken.append(f"link {target}")
    for span in CODE_SPAN.findall(text):
        is_repo_file = "/" in span and REPO_FILE.match(span) and not span.startswith("/")
        if is_repo_file and not resolves(span, path):
            broken.append(f"file {span}")
    for mention in MARKDOWN_MENTION.findall(URL.sub("", text)):
        if not resolves(mention, path):
            broken.append(f"document {mention}")
    return sorted(set(broken))


@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_reference_in_a_document_resolves(path: Path) -> None:
    assert broken_references(path) == []


def test_sources_mention_only_documents_of_the_repository() -> None:
    sources = tracked("*.py", "*.yaml", "*.yml", "*.toml", "*.sh", "Dockerfile", "*.tpl", "*.txt")
    broken = {
        str(path.relative_to(ROOT)): found
        for path in sources
        if path != Path(__file__).resolve()
        and (
            found := [
                mention
                for mention in MARKDOWN_MENTION.findall(
                    URL.sub("", path.read_text(encoding="utf-8"))
                )
                if not resolves(mention, path)
            ]
        )
    }
    assert broken == {}


def test_a_broken_reference_is_found(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "See [the design](ARCHITECTURE.md), `docs/nowhere.md`, notes/nvml.md and "
        "[metrics](docs/metrics.md#gpu).\n"
    )
    assert broken_references(doc) == [
        "document ARCHITECTURE.md",
        "document docs/nowhere.md",
        "document notes/nvml.md",
        "file docs/nowhere.md",
        "link ARCHITECTURE.md",
    ]


def scrape_configs(document: Path) -> dict[str, list[str]]:
    """The scrape job names of each YAML block of `document` that holds `scrape_configs`,
    by the heading of the section the block is in."""
    jobs: dict[str, list[str]] = {}
    heading = ""
    for section in re.split(r"^(## .+)$", document.read_text(), flags=re.M):
        if section.startswith("## "):
            heading = section[3:].strip()
            continue
        for block in re.findall(r"^```yaml\n(.*?)^```", section, flags=re.M | re.S):
            config = yaml.safe_load(block)
            if isinstance(config, dict) and "scrape_configs" in config:
                jobs[heading] = [job["job_name"] for job in config["scrape_configs"]]
    return jobs


def test_documented_scrape_configs_name_every_job_the_rules_select() -> None:
    """A deployment without a job the rules select has alerts that fire on a healthy stack
    (FleetwatchTainterDown for an unscraped tainter): docs/deploy.md's plain Prometheus
    configuration scrapes every component under its rules' job name, and the Slurm one the
    exporter (Slurm has no tainter and no kube-state-metrics)."""
    jobs = load_config().scrape_jobs()
    documented = scrape_configs(ROOT / "docs" / "deploy.md")
    assert sorted(documented["Kubernetes without the Prometheus operator"]) == sorted(jobs.values())
    assert documented["A systemd service on a Slurm node"] == [jobs["exporter"]]
