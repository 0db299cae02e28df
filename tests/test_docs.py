"""The repository stands alone: every relative link and file reference in its documents and
sources resolves to a file in the repository, so a reader never meets a pointer to a document
that only some developers have."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

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
