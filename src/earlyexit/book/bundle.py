"""Figures ready to cite: one zip with every figure, its provenance, CITATION.cff and BibTeX.

    python -m earlyexit figures-bundle [--out PATH] [--url URL]

The zip holds, under ``earlyexit-figures-<version>/``:

- ``figures/<name>.png``, ``.pdf``, ``.svg`` and ``<name>.json`` (the sidecar: provenance and the
  command that rebuilds the figure) for every figure under ``figures/``;
- ``CITATION.cff`` (the book's citation; its version must be the package's);
- ``figures.bib``: one ``@misc`` entry for the book and one per figure (book title, version, figure
  label, the commit that made it, the URL when one is known);
- ``data/``: the published measurements the book compares with (``data/published/``), each row with its source.
- ``README.txt``: what is in the bundle.

Where things live, set in ``_config.yml``: ``html.baseurl`` is where the book is published
(``--url`` overrides it), ``repository.url`` where its repository lives (:func:`repository_url`: when
that is empty, ``git remote get-url origin`` if it is an https URL; else none). An entry or a
CITATION.cff copy names a URL only when one is known, never an empty or made-up one. The book's entry
and the CITATION.cff copies also name the commit they were made at (the figures', the commit that
made each figure).

:func:`bibtex_book` and :func:`bibtex_figure` return the BibTeX for the whole book and for one figure
(for the front page's citation text). The book's Sphinx extension publishes the same files with the
built HTML (:func:`earlyexit.book.sphinxext.publish_site`).
"""
from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
import zipfile
from datetime import date
from pathlib import Path

import yaml

from .. import paths
from ..files import atomic_write_bytes
from .figures import FORMATS

ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed timestamps: the same figures give the same zip


class BundleError(Exception):
    """Something the bundle needs is missing or inconsistent: the message says what to do."""


# ------------------------------------------------------------------------------------ metadata

def package_version(root: Path | None = None) -> str:
    """``[project] version`` of pyproject.toml (the package's version)."""
    import tomllib

    path = Path(root or paths.REPO_ROOT) / "pyproject.toml"
    return tomllib.loads(path.read_text())["project"]["version"]


def citation(root: Path | None = None) -> dict:
    """CITATION.cff, checked against the package version: raises BundleError if they disagree."""
    root = Path(root or paths.REPO_ROOT)
    path = root / "CITATION.cff"
    if not path.exists():
        raise BundleError(f"no CITATION.cff at {path}")
    cff = yaml.safe_load(path.read_text())
    version = package_version(root)
    problems = []
    if str(cff.get("version")) != version:
        problems.append(f"its version is {cff.get('version')!r} but pyproject.toml's [project] version is "
                        f"{version!r}")
    released = cff.get("date-released")
    try:
        released = date.fromisoformat(str(released))
    except ValueError:
        problems.append(f"date-released {released!r} is not a date (YYYY-MM-DD)")
    if not problems and released > date.today():
        problems.append(f"date-released {released} is in the future")
    if problems:
        raise BundleError("CITATION.cff does not follow the package version: " + "; ".join(problems)
                          + " (set CITATION.cff's version to the package version and date-released to the "
                            "day that version was released)")
    return cff


def _config(root: Path | None = None) -> dict:
    """_config.yml ({} when there is none)."""
    path = Path(root or paths.REPO_ROOT) / "_config.yml"
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


def _setting(cfg: dict, section: str, key: str) -> str | None:
    value = str((cfg.get(section) or {}).get(key) or "").strip()
    return value or None


def site_url(root: Path | None = None) -> str | None:
    """Where the book is published: ``html.baseurl`` of _config.yml, else None."""
    return _setting(_config(root), "html", "baseurl")


def https_url(url: str | None) -> str | None:
    """``url`` as a link a reader can follow: an https URL without credentials (``user:token@``) or a
    trailing ``.git``; None for anything else (an ssh remote, a local path, nothing)."""
    from urllib.parse import urlsplit, urlunsplit

    url = (url or "").strip()
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname:
        return None
    host = parts.hostname + (f":{parts.port}" if parts.port else "")
    path = parts.path.rstrip("/")
    path = path[:-4] if path.endswith(".git") else path
    return urlunsplit(("https", host, path, "", ""))


def git_remote_url(root: Path | None = None) -> str | None:
    """``git remote get-url origin`` in ``root`` as :func:`https_url` reads it (None when there is no git,
    no such remote, or it is not an https URL)."""
    try:
        res = subprocess.run(["git", "remote", "get-url", "origin"], cwd=Path(root or paths.REPO_ROOT),
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return https_url(res.stdout) if res.returncode == 0 else None


def repository_url(root: Path | None = None) -> str | None:
    """Where the book's repository lives: ``repository.url`` of _config.yml when set; when it is empty or
    absent, the ``origin`` remote of the checkout if that is an https URL (:func:`git_remote_url`: on
    GitHub Actions, the repository the workflow runs in); else None, and nothing names a repository."""
    return _setting(_config(root), "repository", "url") or git_remote_url(root)


def _git(root: Path | None = None) -> dict:
    from .provenance import git_info

    return git_info(Path(root or paths.REPO_ROOT))


def _commit_text(git: dict | None) -> str | None:
    """'<sha>' or '<sha> (with uncommitted changes)'; None when the commit is not known."""
    commit = str((git or {}).get("commit") or "unknown")
    if commit == "unknown":
        return None
    return commit + (" (with uncommitted changes)" if (git or {}).get("dirty") else "")


def citation_text(root: Path | None = None, *, url: str | None = None, repository: str | None = None,
                  git: dict | None = None) -> str:
    """CITATION.cff as published (in the bundle and the built site): the committed file, checked by
    :func:`citation`, plus what only a build knows, each only when known and not already set:
    ``repository-code`` (:func:`repository_url`, or ``repository``), ``url`` (``url`` or
    :func:`site_url`) and ``commit`` (the commit of this build, ``git`` or the checkout's)."""
    root = Path(root or paths.REPO_ROOT)
    cff = citation(root)
    git = _git(root) if git is None else git
    commit = str(git.get("commit") or "unknown")
    extra = {"repository-code": repository or repository_url(root), "url": url or site_url(root),
             "commit": commit if commit != "unknown" else None}
    extra = {k: v for k, v in extra.items() if v and k not in cff}
    text = (root / "CITATION.cff").read_text()
    if not extra:
        return text
    stamp = yaml.safe_dump(extra, sort_keys=False, allow_unicode=True, width=1000)
    return text.rstrip("\n") + "\n# added by the build (earlyexit.book.bundle.citation_text):\n" + stamp


def _authors(cff: dict) -> str:
    names = []
    for a in cff.get("authors") or []:
        if a.get("name"):
            names.append("{" + _tex(a["name"]) + "}")
        else:
            names.append(_tex(f"{a.get('family-names', '')}, {a.get('given-names', '')}".strip(", ")))
    return " and ".join(names) or "{Anonymous}"


_TEX = {"\\": r"\textbackslash{}", "_": r"\_", "%": r"\%", "&": r"\&", "#": r"\#", "$": r"\$",
        "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def _tex(text: str) -> str:
    return "".join(_TEX.get(c, c) for c in str(text))


def _entry(kind: str, key: str, fields: dict) -> str:
    body = ",\n".join(f"  {k:<12} = {{{v}}}" for k, v in fields.items() if v)
    return f"@{kind}{{{key},\n{body}\n}}\n"


def _key(name: str) -> str:
    return "earlyexit-" + re.sub(r"[^A-Za-z0-9_\-:]", "-", name)


# -------------------------------------------------------------------------------------- BibTeX

def bibtex_book(root: Path | None = None, url: str | None = None, *, repository: str | None = None,
                git: dict | None = None) -> str:
    """The BibTeX entry for the whole book (``@misc{earlyexit-book, ...}``).

    ``url`` is where the book is published (default :func:`site_url`, else the repository); the note
    names the commit of this build (``git``, default the checkout's) and the repository
    (``repository``, default :func:`repository_url`), each only when known."""
    cff = citation(root)
    version = str(cff["version"])
    repository = repository or repository_url(root)
    url = url or site_url(root) or repository
    commit = _commit_text(_git(root) if git is None else git)
    note = ""
    if commit:
        note = f"Built from commit {commit}" + (f" of {repository}" if repository else "") + "."
    elif repository:
        note = f"Source: {repository}."
    return _entry("misc", _key("book"), {
        "title": "{" + _tex(cff["title"]) + "}",
        "author": _authors(cff),
        "year": str(cff["date-released"])[:4],
        "version": _tex(version),
        "howpublished": _tex(f"Online book, version {version}"),
        "note": _tex(note),
        "url": url,
    })


def figure_sidecars(directory: Path | None = None) -> dict[str, dict]:
    """{figure name: sidecar} for every figure under ``directory`` (default figures/).

    Raises BundleError naming every figure whose PNG, PDF, SVG or readable sidecar is missing."""
    directory = Path(directory or paths.FIGURES)
    if not directory.is_dir():
        raise BundleError(f"no figures folder at {directory}: build the book first (make book)")
    stems = sorted({p.stem for p in directory.iterdir() if p.suffix[1:] in (*FORMATS, "json")
                    and not p.name.startswith(".")})
    out, problems = {}, []
    for name in stems:
        missing = [f"{name}.{ext}" for ext in (*FORMATS, "json") if not (directory / f"{name}.{ext}").exists()]
        if missing:
            problems.append(f"{name}: missing {', '.join(missing)}")
            continue
        try:
            side = json.loads((directory / f"{name}.json").read_text())
        except (OSError, ValueError) as e:
            problems.append(f"{name}: {name}.json is not readable JSON ({e})")
            continue
        out[name] = side
    if problems:
        raise BundleError(f"incomplete figures in {directory}:\n  - " + "\n  - ".join(problems)
                          + "\n(rebuild them: each sidecar's 'rerun' command, or make book)")
    if not out:
        raise BundleError(f"no figures in {directory}: build the book first (make book)")
    return out


def bibtex_figure(name: str, directory: Path | None = None, root: Path | None = None,
                  url: str | None = None, sidecar: dict | None = None, *,
                  repository: str | None = None) -> str:
    """The BibTeX entry for one figure (``@misc{earlyexit-<name>, ...}``), from its sidecar.

    Its url is the figure's page where the book is published (``url``, default :func:`site_url`), else
    the repository (``repository``, default :func:`repository_url`), else none; its note names the
    commit that made the figure, of that repository when one is known, and the command that rebuilds it."""
    cff = citation(root)
    if sidecar is None:
        path = Path(directory or paths.FIGURES) / f"{name}.json"
        if not path.exists():
            valid = ", ".join(figure_sidecars(directory)) if Path(directory or paths.FIGURES).is_dir() else ""
            raise BundleError(f"no figure {name!r} (no {path}); figures: {valid or 'none'}")
        sidecar = json.loads(path.read_text())
    prov = sidecar.get("provenance") or {}
    version = str(cff["version"])
    commit = str(prov.get("git_commit") or "unknown")
    dirty = " (with uncommitted changes)" if prov.get("git_dirty") else ""
    notebook = prov.get("notebook")
    repository = repository or repository_url(root)
    base = url or site_url(root)
    page = f"{base.rstrip('/')}/book/generated/{notebook}.html" if base and notebook else base
    note = f"Made at commit {commit}{dirty}"
    if repository and commit != "unknown":
        note += f" of {repository}"
    if prov.get("profile"):
        note += f" with profile {prov['profile']}"
    note += "."
    if sidecar.get("rerun"):
        note += f" Rebuild: {sidecar['rerun']}"
    return _entry("misc", _key(name), {
        "title": "{" + _tex(cff["title"]) + "}, figure " + _tex(name),
        "author": _authors(cff),
        "year": str(cff["date-released"])[:4],
        "version": _tex(version),
        "howpublished": _tex(f"Figure {name} of the book \u201c{cff['title']}\u201d, version {version}")
        .replace("\u201c", "``").replace("\u201d", "''"),
        "note": _tex(note),
        "url": page or repository,
    })


# -------------------------------------------------------------------------------------- bundle

def bibtex_entries(sidecars: dict[str, dict], root: Path | None = None, url: str | None = None, *,
                   git: dict | None = None) -> list[str]:
    """figures.bib as a list of entries: the book's, then one per figure of ``sidecars``
    (:func:`figure_sidecars`), as the bundle and the built site publish them."""
    repository = repository_url(root)
    return [bibtex_book(root, url, repository=repository, git=git)] + [
        bibtex_figure(n, root=root, url=url, sidecar=s, repository=repository) for n, s in sidecars.items()]


def default_out(root: Path | None = None) -> Path:
    root = Path(root or paths.REPO_ROOT)
    return root / "_build" / f"earlyexit-figures-{package_version(root)}.zip"


def published_data(root: Path) -> list[Path]:
    """The published measurements the book compares with (``data/published/*.csv`` and its README), in the bundle
    and on the site beside the figures that use them."""
    folder = Path(root) / "data" / "published"
    return sorted(p for p in folder.glob("*") if p.suffix in (".csv", ".md")) if folder.is_dir() else []


def write_bundle(out: Path | None = None, directory: Path | None = None, root: Path | None = None,
                 url: str | None = None) -> tuple[Path, list[str]]:
    """Write the zip (see the module's docstring); return its path and the names inside it."""
    root = Path(root or paths.REPO_ROOT)
    directory = Path(directory or paths.FIGURES)
    cff = citation(root)
    sidecars = figure_sidecars(directory)
    version = str(cff["version"])
    out = Path(out) if out else default_out(root)
    top = f"earlyexit-figures-{version}/"
    git = _git(root)
    bib = bibtex_entries(sidecars, root, url, git=git)
    readme = [f"{cff['title']}, version {version}: every figure of the book, ready to cite.", "",
              "figures/<name>.png, .pdf, .svg  the figure (PDF and SVG keep text as text)",
              "figures/<name>.json             provenance (parameters, model, software, commit) and the command "
              "that rebuilds it",
              "figures.bib                     BibTeX: the book (earlyexit-book) and each figure (earlyexit-<name>)",
              "data/                           the published measurements the book compares with, each row with its "
              "source",
              "CITATION.cff                    how to cite the book", "", "Figures:"]
    readme += [f"  {n}: {s.get('rerun', '')}" for n, s in sidecars.items()]
    members: list[tuple[str, bytes]] = []
    for name in sidecars:
        for ext in (*FORMATS, "json"):
            members.append((f"{top}figures/{name}.{ext}", (directory / f"{name}.{ext}").read_bytes()))
    members += [(f"{top}data/{f.name}", f.read_bytes()) for f in published_data(root)]
    members += [(f"{top}CITATION.cff", citation_text(root, url=url, git=git).encode()),
                (f"{top}figures.bib", "\n".join(bib).encode()),
                (f"{top}README.txt", ("\n".join(readme) + "\n").encode())]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for arcname, data in members:
            info = zipfile.ZipInfo(arcname, date_time=ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            z.writestr(info, data)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out, buf.getvalue())
    return out, [m[0] for m in members]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m earlyexit figures-bundle",
                                 description="Write a zip of every figure (PNG, PDF, SVG, JSON sidecar) with "
                                             "CITATION.cff and a BibTeX file with one entry per figure.")
    ap.add_argument("--out", type=Path, default=None,
                    help="the zip to write (default _build/earlyexit-figures-<version>.zip)")
    ap.add_argument("--figures", type=Path, default=None, help="the figures folder (default figures/)")
    ap.add_argument("--url", default=None,
                    help="where the book is published (default: html.baseurl of _config.yml); the entries also "
                         "name the repository (repository.url of _config.yml, else an https origin remote)")
    args = ap.parse_args(argv)
    try:
        out, names = write_bundle(args.out, args.figures, url=args.url)
    except BundleError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    with zipfile.ZipFile(out) as z:
        for info in z.infolist():
            print(f"{info.file_size:>10}  {info.filename}")
    n = sum(1 for m in names if m.endswith(".json"))
    print(f"{n} figures -> {out}")
    return 0
