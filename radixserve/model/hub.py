"""Models by name: ``ORG/NAME`` (or ``ORG/NAME:QUANT``) fetched from the Hugging Face Hub.

Contract: ``resolve_engine_config(cfg)`` returns ``cfg`` with each model it names by a Hub id
(``model.path``, ``model.tokenizer_path``, ``scheduler.speculative_draft_model``) replaced by a
local path, fetched through ``huggingface_hub`` into the shared Hugging Face cache (or
``model.download_dir``), and ``model.gguf_file`` cleared once used.  It runs once, in the process
that starts the others (the HTTP launcher, ``Engine``), so the worker, the ranks and the draft
runner see local paths only and never download.  A name is a Hub id only when no file or
directory of that name exists and it reads ``ORG/NAME[:QUANT]`` (a ``.gguf`` name is a file).

What is fetched: ``config*.json``, ``generation_config.json``, the tokenizer's and the chat
template's files, and the weights: the top-level ``*.safetensors`` (only the shards its index
names, when it has one), else ``pytorch_model*.bin``; never another format or a subfolder.
``:QUANT`` (matched case-insensitively against the repository's ``.gguf`` names, as llama.cpp's
``-hf`` does) or ``gguf_file`` fetch that one GGUF file instead, which ``loader.resolve_hf_dir``
converts.  ``model.revision``, ``HF_TOKEN``, ``HF_ENDPOINT`` and ``HF_HUB_OFFLINE`` are honoured
(the variables read at each call); with the Hub offline or unreachable the cache serves what it
holds.  Every failure is a ``HubError`` (an ``OSError``) of one line: an unknown repository, a
gated one without a token, an unknown revision, no Hub and nothing cached, no weights in a
supported format, no (or more than one) GGUF file matching.  Never imports torch.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import json
import logging
import os
import re
from typing import Any, Optional

logger = logging.getLogger(__name__)

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(?::[\w.+-]+)?")
META_FILES = ("config*.json", "generation_config.json", "tokenizer*", "special_tokens_map.json",
              "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt", "chat_template.json",
              "chat_template.jinja", "*.tiktoken")
ST_INDEX, BIN_INDEX = "model.safetensors.index.json", "pytorch_model.bin.index.json"


class HubError(OSError):
    """Why a model named by a Hub id could not be had, in one line."""


def is_hub_id(name: Optional[str]) -> bool:
    """``name`` reads ``ORG/NAME[:QUANT]`` and no file or directory of that name exists."""
    if not name:
        return False
    return not os.path.exists(name) and not name.lower().endswith(".gguf") and HUB_ID.fullmatch(name) is not None


def resolve_engine_config(cfg: Any, show_progress: bool = False) -> Any:
    """``cfg`` (an ``EngineConfig``) with its Hub ids replaced by local paths (see the contract)."""
    model, sched = cfg.model, cfg.scheduler
    if model.gguf_file and not is_hub_id(model.path):
        raise HubError(f"gguf_file: --model {model.path!r} is a local path, not a Hub repository ORG/NAME")
    path, tok, draft = model.path, model.tokenizer_path, sched.speculative_draft_model
    if is_hub_id(path):
        path = fetch(path, model.revision, model.download_dir, model.gguf_file, show_progress)
    if is_hub_id(tok):
        tok = fetch(tok, None, model.download_dir, show_progress=show_progress, tokenizer_only=True)
    if is_hub_id(draft):
        draft = fetch(draft, None, model.download_dir, show_progress=show_progress)
    if (path, tok, draft) == (model.path, model.tokenizer_path, sched.speculative_draft_model):
        return cfg
    return dataclasses.replace(
        cfg, model=dataclasses.replace(model, path=path, tokenizer_path=tok, gguf_file=None),
        scheduler=dataclasses.replace(sched, speculative_draft_model=draft))


def fetch(ref: str, revision: Optional[str] = None, cache_dir: Optional[str] = None,
          gguf_file: Optional[str] = None, show_progress: bool = False, tokenizer_only: bool = False) -> str:
    """The local path of the Hub model ``ref``: its snapshot directory, or with ``:QUANT`` or
    ``gguf_file`` its one ``.gguf`` file, fetched as needed.  Raises ``HubError``."""
    repo, _, quant = ref.partition(":")
    if quant and gguf_file:
        raise HubError(f"gguf_file: give {ref} or --gguf-file {gguf_file}, not both")
    hub = _Repo(repo, revision, cache_dir, show_progress)
    try:
        files = hub.list_files()
        if quant or gguf_file:
            return hub.download_file(pick_gguf(repo, files, quant, gguf_file))
        return hub.download(serving_files(hub, files, tokenizer_only))
    except HubError:
        raise
    except Exception as e:  # huggingface_hub's and the HTTP client's errors, each as one line
        raise HubError(hub.explain(e)) from e


def serving_files(hub: "_Repo", files: list[str], tokenizer_only: bool = False) -> list[str]:
    """The repository's files serving needs: config, tokenizer and template files and one weights format."""
    top = [f for f in files if "/" not in f]
    meta = [f for f in top if any(fnmatch.fnmatchcase(f, p) for p in META_FILES)]
    if tokenizer_only:
        return meta
    weights = [f for f in top if f.endswith(".safetensors")]
    if weights and ST_INDEX in top:  # only the shards the index names (not e.g. a consolidated copy)
        with open(hub.download_file(ST_INDEX)) as fh:
            weights = sorted(set(json.load(fh)["weight_map"].values())) + [ST_INDEX]
    if not weights:
        weights = [f for f in top if fnmatch.fnmatchcase(f, "pytorch_model*.bin") or f == BIN_INDEX]
    if not weights:
        ggufs = [f for f in files if f.lower().endswith(".gguf")]
        hint = (f"; it has GGUF files, name one as {hub.repo}:QUANT or with --gguf-file: {_listing(ggufs)}"
                if ggufs else f" (its files: {_listing(files)})")
        raise HubError(f"model: {hub.repo} has no weights in a supported format "
                       f"(*.safetensors or pytorch_model*.bin){hint}")
    return meta + weights


def pick_gguf(repo: str, files: list[str], quant: str, gguf_file: Optional[str]) -> str:
    """The one ``.gguf`` file that ``gguf_file`` names, or whose name carries ``quant`` (case-insensitive,
    between separators; one ending in it wins over one that goes on, e.g. Q4_K over Q4_K_M)."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf"))
    if gguf_file:
        if gguf_file in files:
            return gguf_file
        raise HubError(f"gguf_file: {repo} has no file {gguf_file!r}; its GGUF files: {_listing(ggufs)}")
    q = re.escape(quant.lower())
    stems = {f: os.path.basename(f).lower()[:-len(".gguf")] for f in ggufs if "mmproj" not in f.lower()}
    hits = [f for f, s in stems.items() if re.search(rf"(^|[-._]){q}([-._]|$)", s)]
    ending = [f for f in hits if re.search(rf"(^|[-._]){q}$", stems[f])]
    if len(hits) > 1 and len(ending) == 1:
        hits = ending
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise HubError(f"model: {quant} matches several GGUF files of {repo}: {_listing(hits)}; "
                       f"name one with --gguf-file")
    raise HubError(f"model: {repo} has no GGUF file matching {quant}; its GGUF files: {_listing(ggufs)}")


def _listing(names: list[str], most: int = 12) -> str:
    if not names:
        return "none"
    return ", ".join(names[:most]) + (f", ... ({len(names) - most} more)" if len(names) > most else "")


class _Repo:
    """One repository at one revision, online or from the cache (``HF_HUB_OFFLINE``, or no connection)."""

    def __init__(self, repo: str, revision: Optional[str], cache_dir: Optional[str], show_progress: bool) -> None:
        from huggingface_hub import constants

        self.repo, self.revision, self.show_progress = repo, revision, show_progress
        self.cache_dir = os.path.expanduser(cache_dir or constants.HF_HUB_CACHE)
        self.endpoint = (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
        offline = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")
        self.offline = self.local_only = offline or constants.is_offline_mode()
        self.unreachable: Optional[Exception] = None

    def list_files(self) -> list[str]:
        """The repository's files: from the Hub, else (offline, unreachable) from the cached snapshot."""
        if not self.offline:
            from huggingface_hub import HfApi

            try:
                info = HfApi(endpoint=self.endpoint).model_info(self.repo, revision=self.revision)
                logger.info("model %s: revision %s at %s", self.repo, info.sha, self.endpoint)
                return [s.rfilename for s in info.siblings or []]
            except _transport_errors() as e:
                self.unreachable, self.local_only = e, True
        files = self._cached_files()
        if files is None:
            raise HubError(self._uncached())
        return files

    def _cached_files(self) -> Optional[list[str]]:
        from huggingface_hub.file_download import repo_folder_name

        storage = os.path.join(self.cache_dir, repo_folder_name(repo_id=self.repo, repo_type="model"))
        rev = self.revision or "main"
        commit = rev if re.fullmatch(r"[0-9a-f]{40}", rev) else None
        ref = os.path.join(storage, "refs", rev)
        if commit is None and os.path.isfile(ref):
            with open(ref) as fh:
                commit = fh.read().strip()
        snapshot = os.path.join(storage, "snapshots", commit or "")
        if not commit or not os.path.isdir(snapshot):
            return None
        return sorted(os.path.relpath(os.path.join(d, f), snapshot).replace(os.sep, "/")
                      for d, _, names in os.walk(snapshot) for f in names)

    def _uncached(self) -> str:
        why = "HF_HUB_OFFLINE is set" if self.offline else f"the Hub at {self.endpoint} cannot be reached"
        if not self.offline and self.unreachable is not None:
            why += f" ({type(self.unreachable).__name__})"
        return (f"model: {why} and {self.repo} (revision {self.revision or 'main'}) is not in the cache "
                f"{self.cache_dir}")

    def _kw(self) -> dict[str, Any]:
        kw: dict[str, Any] = dict(revision=self.revision, cache_dir=self.cache_dir, endpoint=self.endpoint,
                                  local_files_only=self.local_only)
        if not self.show_progress:
            from tqdm.auto import tqdm

            kw["tqdm_class"] = type("Quiet", (tqdm,), {"__init__": lambda bar, *a, **k: tqdm.__init__(
                bar, *a, **{**k, "disable": True})})
        return kw

    def download(self, names: list[str]) -> str:
        """The snapshot directory holding ``names`` (fetched as needed)."""
        from huggingface_hub import snapshot_download

        if not self.local_only:
            logger.info("model %s: fetching %d files (%s) into %s", self.repo, len(names), _listing(names, 6),
                        self.cache_dir)
        patterns = [re.sub(r"([\[\]*?])", r"[\1]", n) for n in names]  # exact names, as fnmatch patterns
        return snapshot_download(self.repo, allow_patterns=patterns, **self._kw())

    def download_file(self, name: str) -> str:
        """The local path of the repository's file ``name`` (fetched as needed)."""
        from huggingface_hub import hf_hub_download

        if not self.local_only:
            logger.info("model %s: fetching %s into %s", self.repo, name, self.cache_dir)
        return hf_hub_download(self.repo, name, **self._kw())

    def explain(self, e: Exception) -> str:
        """huggingface_hub's (or the HTTP client's) exception ``e`` as one line."""
        from huggingface_hub import errors, get_token

        repo, rev = self.repo, self.revision or "main"
        if isinstance(e, errors.GatedRepoError):
            if get_token():
                return f"model: {repo} is gated and the token (HF_TOKEN) has no access: accept its terms on the Hub"
            return f"model: {repo} is gated: accept its terms on the Hub, then set HF_TOKEN (or run `hf auth login`)"
        if isinstance(e, errors.RepositoryNotFoundError):
            return (f"model: {repo!r} is neither a local path nor a repository on the Hub at {self.endpoint} "
                    f"(a private one needs HF_TOKEN)")
        if isinstance(e, errors.RevisionNotFoundError):
            return f"revision: {repo} has no revision {rev!r} on the Hub at {self.endpoint}"
        if isinstance(e, (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled)):
            return self._uncached().replace("is not in the cache", "is not (completely) in the cache")
        if isinstance(e, errors.EntryNotFoundError):
            return f"model: {repo} (revision {rev}) lacks a file it lists: {str(e).splitlines()[0]}"
        if isinstance(e, errors.HfHubHTTPError) and e.response is not None:
            return f"model: the Hub at {self.endpoint} answered HTTP {e.response.status_code} for {repo}"
        if isinstance(e, _transport_errors()):
            return f"model: lost the Hub at {self.endpoint} while fetching {repo} ({type(e).__name__})"
        if isinstance(e, errors.HFValidationError):
            return f"model: {repo!r} is not a valid Hub repository id"
        lines = str(e).strip().splitlines()
        return f"model: fetching {repo} from the Hub failed: {type(e).__name__}: {lines[0] if lines else ''}"


def _transport_errors() -> tuple[type, ...]:
    """Connection-level errors of the HTTP clients huggingface_hub may use (no answer from the Hub)."""
    out: list[type] = [ConnectionError, TimeoutError]
    for mod in ("httpx2", "httpx"):
        try:
            out.append(__import__(mod).TransportError)
        except (ImportError, AttributeError):
            pass
    return tuple(out)
