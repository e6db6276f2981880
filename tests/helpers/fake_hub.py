"""A local stand-in for the Hugging Face Hub: the few routes ``huggingface_hub``'s
``snapshot_download`` and ``hf_hub_download`` call, served on 127.0.0.1 (point ``HF_ENDPOINT`` at
``FakeHub.url``).  No test ever reaches the real Hub.

Routes, as huggingface_hub 2.x calls them (``hf_api.model_info``, ``list_repo_tree``,
``file_download.get_hf_file_metadata`` / ``http_get``):

- ``GET /api/models/{repo}[/revision/{rev}]``: ``{"id", "sha", "siblings": [{"rfilename"}]}``
- ``GET /api/models/{repo}/tree/{rev}``: ``[{"type": "file", "path", "size", "oid"}]`` (one page)
- ``HEAD`` / ``GET /{repo}/resolve/{rev}/{path}``: ``X-Repo-Commit``, ``ETag``, ``Content-Length``
  (and the bytes)

Errors carry the Hub's ``X-Error-Code``: ``RepoNotFound`` (401, as the Hub answers an anonymous
caller), ``GatedRepo`` (401 without ``Authorization: Bearer FakeHub.TOKEN``), ``RevisionNotFound``
and ``EntryNotFound`` (404).  ``fetched`` lists the files whose bytes were sent.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional


def dir_files(path: str) -> dict[str, bytes]:
    """Every file under ``path`` by its '/'-separated relative name."""
    out = {}
    for d, _, names in os.walk(path):
        for n in names:
            full = os.path.join(d, n)
            out[os.path.relpath(full, path).replace(os.sep, "/")] = open(full, "rb").read()
    return out


@dataclass
class FakeRepo:
    refs: dict[str, str] = field(default_factory=dict)  # branch or tag -> commit
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit -> files
    gated: bool = False

    def commit_of(self, rev: str) -> Optional[str]:
        return rev if rev in self.commits else self.refs.get(rev)


class FakeHub:
    TOKEN = "hf_fake_token"

    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.fetched: list[tuple[str, str]] = []  # (repo, path) of every GET of a file's bytes
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                hub._answer(self, body=True)

            def do_HEAD(self) -> None:
                hub._answer(self, body=False)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def add(self, repo: str, files: dict[str, bytes], revision: str = "main", gated: bool = False) -> str:
        """Publish ``files`` as ``revision`` of ``repo``; returns the commit id."""
        r = self.repos.setdefault(repo, FakeRepo())
        r.gated = r.gated or gated
        h = hashlib.sha1(f"{repo}@{revision}".encode())
        for name in sorted(files):
            h.update(name.encode() + hashlib.sha256(files[name]).digest())
        commit = h.hexdigest()
        r.commits[commit], r.refs[revision] = dict(files), commit
        return commit

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def fetched_from(self, repo: str) -> set[str]:
        return {p for r, p in self.fetched if r == repo}

    # ------------------------------------------------------------------ routes
    def _answer(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        parts = [urllib.parse.unquote(p) for p in urllib.parse.urlsplit(h.path).path.strip("/").split("/")]
        api = parts[:2] == ["api", "models"]
        if api:
            parts = parts[2:]
        repo_id, rest = "/".join(parts[:2]), parts[2:]
        repo = self.repos.get(repo_id)
        if repo is None:
            return self._error(h, 401, "RepoNotFound", "Repository not found")
        if repo.gated and h.headers.get("Authorization") != f"Bearer {self.TOKEN}":
            return self._error(h, 401, "GatedRepo", "Access to this model is restricted")
        if api and not rest:
            rev = "main"
        elif api and rest[0] in ("revision", "tree") and len(rest) >= 2:
            rev = rest[1]
        elif not api and len(rest) >= 3 and rest[0] == "resolve":
            rev = rest[1]
        else:
            return self._error(h, 404, None, "Not found")
        commit = repo.commit_of(rev)
        if commit is None:
            return self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {rev}")
        files = repo.commits[commit]
        if api and rest and rest[0] == "tree":
            tree = [{"type": "file", "path": p, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                    for p, b in sorted(files.items())]
            return self._send(h, 200, json.dumps(tree).encode(), body, {"Content-Type": "application/json"})
        if api:
            info = {"id": repo_id, "modelId": repo_id, "sha": commit, "private": False, "gated": repo.gated,
                    "siblings": [{"rfilename": p} for p in sorted(files)]}
            return self._send(h, 200, json.dumps(info).encode(), body, {"Content-Type": "application/json"})
        name = "/".join(rest[2:])
        if name not in files:
            return self._error(h, 404, "EntryNotFound", f"{name} does not exist", {"X-Repo-Commit": commit})
        data = files[name]
        if body:
            self.fetched.append((repo_id, name))
        return self._send(h, 200, data, body, {"X-Repo-Commit": commit, "Content-Type": "application/octet-stream",
                                               "ETag": f'"{hashlib.sha256(data).hexdigest()}"'})

    def _error(self, h: BaseHTTPRequestHandler, status: int, code: Optional[str], message: str,
               extra: Optional[dict] = None) -> None:
        headers = {"X-Error-Message": message, "Content-Type": "application/json", **(extra or {})}
        if code:
            headers["X-Error-Code"] = code
        self._send(h, status, json.dumps({"error": message}).encode(), h.command != "HEAD", headers)

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, data: bytes, body: bool, headers: dict) -> None:
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(data)))
        h.send_header("Connection", "close")  # no kept-alive connection outlives stop()
        h.close_connection = True
        h.end_headers()
        if body:
            h.wfile.write(data)
