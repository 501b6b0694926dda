"""`pull`, `models list`, `models add`: the catalog and the model cache."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..store import filehash
from ..store.catalog import (PairEntry, add_user_model, add_user_pair, load_catalog, local_path,
                             register_user_model)
from ..errors import ConfigError, ModelLoadError, PairError, PullError
from ..llamacpp.gguf_info import check_gguf_header
from ..store.hub import hub_entry, is_hub_ref, parse_hub_ref
from ..store.pull import CacheCheck, check_cached, corrupt_message, ensure_models
from ..units import SIZE_UNITS_NOTE, human_size
from .common import console, err_console, friendly
from .pull_ui import DownloadUI, download_bar


def _pull_hub(ref_text: str, name: str | None, yes: bool) -> None:
    """`pull hf:ORG/REPO[:QUANT|/FILE]`: ask the hub for the file and its sha256, pull it into
    the cache (atomic, verified) and register it under a model name."""
    ref = parse_hub_ref(ref_text)
    entry = hub_entry(ref, name)
    cat = load_catalog()
    old = cat.models.get(entry.name)
    if old is not None and (old.sha256 != entry.sha256 or not old.user):
        raise ConfigError(f"a different model is already named {entry.name!r}; choose a name with --name")
    ((_, path, checked),) = _pull_entries([entry], yes, label=str(ref))
    record = {"file": entry.file, "size": entry.size, "sha256": entry.sha256, "role": None,
              "description": entry.description, "sources": [dict(s) for s in entry.sources]}
    register_user_model(entry.name, record)
    console.print(Text(f"{ref} -> {entry.name}: {human_size(entry.size)}, {checked}  {path}"), soft_wrap=True)
    console.print(Text(f"use it with -m {entry.name} (target) or -md {entry.name} (draft); "
                       f"pair it with: easd-local models add-pair NAME --draft D --target T"), soft_wrap=True)


def _what_was_checked(entry, findings: list[CacheCheck]) -> str:
    """What pull can truthfully say about a file, from the checks ``ensure_models`` made:
    the first, and (when it had to pull) the one made under the pull's lock."""
    sha = f"sha256 {entry.sha256[:12]}…"
    if len(findings) == 1:  # nothing was downloaded
        if findings[0].state == "trusted":
            return (f"already present, unchanged (size, mtime, inode) since its {sha} was verified, not re-read "
                    "(`easd-local models verify` re-reads it)")
        return f"already present, {sha} hashed now: verified"
    if findings[-1].ok:  # another pull finished it while this one waited for the lock
        return f"downloaded by another pull meanwhile, {sha} verified"
    return f"downloaded, {sha} verified"


def _pull_entries(entries, yes: bool, label: str):
    """Pull ``entries`` (a corrupt cached file is named, then downloaded again); return
    (entry, path, what was checked) for each."""
    findings: dict[str, list[CacheCheck]] = {}

    def on_found(e, found: CacheCheck) -> None:
        # said before it is replaced; a `models add` file is never replaced: its error says what to do
        if found.state == "corrupt" and not findings.get(e.name) and e.path is None:
            err_console.print(Text(f"{corrupt_message(e, found, hint=False)}; downloading it again", style="yellow"),
                              soft_wrap=True)
        findings.setdefault(e.name, []).append(found)

    with DownloadUI(yes) as dl:
        paths_ = ensure_models(entries, dl.confirm, dl.progress, label=label, replace_corrupt=True,
                               on_found=on_found)
    return [(e, p, _what_was_checked(e, findings[e.name])) for e, p in zip(entries, paths_)]


def register(app: typer.Typer, models_app: typer.Typer) -> None:
    @app.command("pull")
    @friendly
    def pull(
        name: Annotated[Optional[str], typer.Argument(
            metavar="NAME|hf:REF", show_default=False,
            help="A model or pair from the catalog (default: the default pair), or a GGUF on the Hugging Face "
                 "Hub as llama.cpp's -hf names it: hf:ORG/REPO\\[:QUANT] (QUANT defaults to Q4_K_M) or "
                 "hf:ORG/REPO/FILE.")] = None,
        as_name: Annotated[Optional[str], typer.Option(
            "--name", metavar="NAME", help="hf: only: the model name to register it under \\[default: the file's "
            "name]")] = None,
        yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask before downloads over 1 GB.")] = False,
    ) -> None:
        """Download models into the cache, verify their sha256 and register them.

        hf:ORG/REPO[:QUANT] and hf:ORG/REPO/FILE need huggingface_hub (pip install 'easd-local\\[hf]') and a hub that answers ($HF_ENDPOINT, default huggingface.co).
        """
        if name is not None and is_hub_ref(name):
            _pull_hub(name, as_name, yes)
            return
        if as_name is not None:
            raise ConfigError("--name is only for hf: references")
        cat = load_catalog()
        _kind, entries = cat.resolve(name)
        entries = list({e.name: e for e in entries}.values())
        for e, path, checked in _pull_entries(entries, yes, label=name or cat.default_pair_name):
            console.print(Text(f"{e.name}: {human_size(e.size)}, {checked}  {path}"), soft_wrap=True)

    @models_app.command("verify")
    @friendly
    def models_verify(
        names: Annotated[Optional[list[str]], typer.Argument(
            metavar="NAME|PATH", show_default=False,
            help="Models or pairs from the catalog, or model files \\[default: every model that is downloaded]")] = None,
    ) -> None:
        """Read downloaded models in full and check their sha256 against the catalog.

        It catches what the quick check before every command cannot: a file changed without a change to its size, mtime or inode (bit rot, a restored mtime). A corrupt file is then refused until `easd-local pull NAME` replaces it. Exit status 2 if one is corrupt.
        """
        entries, loose = _verify_targets(names)
        bad = []
        with download_bar(transient=True, disable=not err_console.is_terminal) as prog:
            for e in entries:
                found = check_cached(e, read=False)  # the read, with its bar, comes below
                if found.state == "missing":
                    if names:
                        console.print(Text(f"{e.name}: not downloaded  {local_path(e)}"), soft_wrap=True)
                    continue
                if found.state == "wrong-size":  # nothing to hash: it cannot be right
                    bad.append(e)
                    console.print(Text(corrupt_message(e, found)), soft_wrap=True)
                    continue
                task = prog.add_task(e.name, total=e.size, stage="hashing")
                found = check_cached(e, lambda d, t, _m, task=task: prog.update(task, completed=d, total=t),
                                     rehash=True)
                prog.remove_task(task)
                if found.ok:
                    console.print(Text(f"{e.name}: sha256 {e.sha256[:12]}… verified (read in full)  {local_path(e)}"),
                                  soft_wrap=True)
                else:
                    bad.append(e)
                    console.print(Text(corrupt_message(e, found)), soft_wrap=True)
            for path in loose:  # a file no catalog model lives in: its hash is all there is to say
                task = prog.add_task(path.name, total=None, stage="hashing")
                try:
                    sha = filehash.sha256_of(path, rehash=True,
                                             progress=lambda d, t, task=task: prog.update(task, completed=d, total=t))
                except OSError as e:
                    raise PullError(f"cannot read {path}: {e.strerror or e}") from None
                prog.remove_task(task)
                console.print(Text(f"{path}: sha256 {sha}, not a catalog model's file (nothing to compare with)"),
                              soft_wrap=True)
        if bad:
            n = len(bad)
            # a `models add` file cannot be downloaded: its line above says to add it again
            fix = (f"`easd-local pull NAME` downloads {'them' if n != 1 else 'it'} again"
                   if all(e.path is None for e in bad) else "each line above says what to do")
            raise PullError(f"{n} corrupt model{'s' if n != 1 else ''} ({', '.join(e.name for e in bad)}): {fix}")
        if not entries and not loose:
            console.print("no model is downloaded yet (`easd-local pull` fetches the default pair)")

    @models_app.command("list")
    @friendly
    def models_list() -> None:
        """Catalog models (built-in and user-added) and pairs, and whether they are cached."""
        cat = load_catalog()
        # a pipe or log gets whole rows rather than cells folded at 80 columns
        out = console if console.is_terminal else Console(highlight=False, width=max(console.width, 200))
        t = Table(title="models", title_justify="left", box=box.SIMPLE_HEAD, caption=SIZE_UNITS_NOTE,
                  caption_justify="left")
        t.add_column("name", overflow="fold")
        t.add_column("role", no_wrap=True)
        t.add_column("file", overflow="fold")
        t.add_column("size", justify="right", no_wrap=True)
        t.add_column("present", no_wrap=True)
        t.add_column("path", overflow="fold")
        # the file-hash stamp answers without reading gigabytes; a listing never hashes
        state = {m.name: check_cached(m, read=False).state for m in cat.models.values()}
        shown = {"trusted": "yes", "missing": "no", "wrong-size": "no (wrong size)", "corrupt": "corrupt"}

        def _presence(m) -> str:
            if m.name not in state:  # a pair's model that the models table does not list
                state[m.name] = check_cached(m, read=False).state
            return shown.get(state[m.name], state[m.name])

        for m in cat.models.values():
            t.add_row(
                m.name + (" (user)" if m.user else ""),
                m.role or "-",
                m.file,
                human_size(m.size),
                _presence(m),
                str(local_path(m)),
            )
        out.print(t)
        p = Table(title="pairs", title_justify="left", box=box.SIMPLE_HEAD)
        p.add_column("name", overflow="fold")
        p.add_column("draft", overflow="fold")
        p.add_column("target", overflow="fold")
        p.add_column("present", no_wrap=True)
        p.add_column("profile", no_wrap=True)
        p.add_column("check", overflow="fold")
        for pr in cat.pairs.values():
            both = _presence(pr.draft) == _presence(pr.target) == "yes"
            check = "-"
            if pr.check:
                check = (f"compatible, {pr.check.get('shared_vocab', 0):,} shared tokens ({pr.check.get('checked', '?')})"
                         if pr.check.get("compatible") else "incompatible")
            p.add_row(
                pr.name + (" (default)" if pr.name == cat.default_pair_name else "") + (" (user)" if pr.user else ""),
                pr.draft.name,
                pr.target.name,
                "yes" if both else "no",
                "yes" if pr.profile else "-",
                check,
            )
        out.print(p)
        if "unverified" in state.values():
            out.print(Text("unverified: the right size, but changed since its sha256 was last checked; "
                           "`easd-local models verify` hashes it"), soft_wrap=True)

    @models_app.command("add")
    @friendly
    def models_add(
        name: Annotated[str, typer.Argument(metavar="NAME", help="Name to register the model under.")],
        path: Annotated[str, typer.Argument(metavar="PATH", help="A local GGUF file (stays where it is).")],
        role: Annotated[Optional[str], typer.Option("--role", metavar="draft|target",
                                                    help="What the model is for (informational). \\[default: none]")] = None,
    ) -> None:
        """Register a local GGUF file in the user catalog (records size and sha256).

        An existing user model of that name is replaced, if each user pair that uses it still passes the pair check.
        """
        old = load_catalog().models.get(name)
        rechecked = _recheck_pairs(name, path)
        entry = add_model_with_bar(name, path, role)
        for pr, n_shared in rechecked:  # their stored verdicts were about the old file
            add_user_pair(pr.name, pr.draft.name, pr.target.name, pair_check_record(n_shared), pr.description)
        if old is not None and old.user:
            console.print(Text(f"replaced model {name} (was {local_path(old)})"), soft_wrap=True)
        console.print(Text(
            f"added {entry.name}: {human_size(entry.size)}, sha256 {entry.sha256[:12]}…, "
            f"role {entry.role or '-'}  {entry.path}"), soft_wrap=True)
        for pr, n_shared in rechecked:
            console.print(Text(f"pair {pr.name} checked again: compatible, shared vocabulary {n_shared:,} tokens"),
                          soft_wrap=True)


def _recheck_pairs(name: str, path: str) -> list[tuple[PairEntry, int]]:
    """The user pairs that use model ``name``, each checked with the file ``path`` in its place:
    (pair, shared vocabulary); PairError naming the first pair that the file would break."""
    from pathlib import Path

    from ..engine.pair import check_pair_files

    pairs = [pr for pr in load_catalog().pairs.values() if pr.user and name in (pr.draft.name, pr.target.name)]
    if not pairs:
        return []
    new = check_gguf_header(Path(path).expanduser())  # a bad file is named as such, not as a broken pair
    checked = []
    for pr in pairs:
        what = f"{name} not replaced: pair {pr.name} ({pr.draft.name} -> {pr.target.name})"
        d = new if pr.draft.name == name else local_path(pr.draft)
        t = new if pr.target.name == name else local_path(pr.target)
        try:
            checked.append((pr, check_pair_files(d, t)))
        except PairError as e:
            raise PairError(f"{what} would break: {e}; add the file under another name") from None
        except ModelLoadError as e:
            raise ModelLoadError(f"{what} cannot be checked again: {e}") from None
    return checked


def pair_check_record(n_shared: int) -> dict[str, object]:
    """What the user catalog keeps of a passed pair check (``models list`` shows it)."""
    import datetime

    from .. import __version__

    return {"compatible": True, "shared_vocab": n_shared,
            "checked": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "by": f"easd-local {__version__} (llama.cpp's draft/target vocabulary rules)"}


def _verify_targets(names: list[str] | None):
    """What `models verify` checks: catalog entries (named, in pairs, or whose file a PATH
    is) and files that are no catalog model's."""
    from pathlib import Path

    cat = load_catalog()
    if not names:
        return [e for e in cat.models.values() if local_path(e).exists()], []
    by_path = {local_path(e).resolve(): e for e in cat.models.values()}
    entries: dict[str, object] = {}
    loose: list[Path] = []
    for ref in names:
        p = Path(ref).expanduser()
        if ref not in cat.models and ref not in cat.pairs and p.is_file():
            e = by_path.get(p.resolve())
            if e is None:
                loose.append(p)
            else:
                entries[e.name] = e
            continue
        if ref not in cat.models and ref not in cat.pairs and ("/" in ref or ref.endswith(".gguf")):
            raise ConfigError(f"no such file: {ref}")
        for e in cat.resolve(ref)[1]:
            entries[e.name] = e
    return list(entries.values()), loose


def add_model_with_bar(name: str, path: str, role: str | None = None):
    """``add_user_model`` with a hashing bar (bytes, rate, time left) on a terminal."""
    from pathlib import Path

    try:
        total = Path(path).expanduser().stat().st_size
    except OSError:
        total = None  # add_user_model says what is wrong
    with download_bar(transient=True, disable=not err_console.is_terminal) as prog:
        task = prog.add_task(name, total=total, stage="hashing")
        return add_user_model(name, path, role=role, progress=lambda d, t: prog.update(task, completed=d, total=t))


