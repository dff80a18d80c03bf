"""A small server that speaks the Hugging Face Hub's HTTP API, for tests (point ``HF_ENDPOINT`` at it).

It answers what the real clients ask for — ``huggingface_hub`` (``hf_hub_download``, ``snapshot_download``,
``HfApi.model_info`` / ``dataset_info`` / ``list_repo_tree``), ``transformers.from_pretrained("org/x")``,
``datasets.load_dataset("org/ds")``:

    GET  /api/{models,datasets}/<repo>[/revision/<rev>]      repo info: sha, siblings, gated, safetensors
    GET  /api/{models,datasets}/<repo>/tree/<rev>[/<path>]   the files under a folder (``recursive=1``)
    GET  /api/{models,datasets}/<repo>/paths-info/<rev>      (POST) info on some paths
    HEAD/GET /<repo>/resolve/<rev>/<file>                    a model file, with ETag, X-Repo-Commit,
    HEAD/GET /datasets/<repo>/resolve/<rev>/<file>           Content-Length, Range

A gated repo answers its files with 401 and ``X-Error-Code: GatedRepo`` unless the request carries the
server's token; a missing repo, revision or file answers 404 with the Hub's error code. ``delay_per_byte``
slows file bodies down (a slow download). Every request is recorded in ``requests`` (method, path).
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit


@dataclass
class Repo:
    """One repo: its revisions (name -> {path: bytes}); ``main`` is the default branch."""

    revisions: dict[str, dict[str, bytes]]
    gated: bool = False
    private: bool = False

    def sha(self, rev: str) -> str:
        files = self.revisions[rev]
        h = hashlib.sha1(rev.encode())
        for name in sorted(files):
            h.update(name.encode() + hashlib.sha1(files[name]).digest())
        return h.hexdigest()

    def find(self, rev: str) -> str | None:
        """The revision name ``rev`` (a branch or a commit sha) stands for."""
        if rev in self.revisions:
            return rev
        return next((r for r in self.revisions if self.sha(r) == rev), None)


def files_of(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()
    }


def safetensors_parameters(files: dict[str, bytes]) -> dict[str, Any] | None:
    """The Hub's ``safetensors`` summary ({parameters: {dtype: n}, total}) from the files' headers."""
    counts: dict[str, int] = {}
    for name, blob in files.items():
        if not name.endswith(".safetensors"):
            continue
        (size,) = struct.unpack("<Q", blob[:8])
        for key, entry in json.loads(blob[8 : 8 + size]).items():
            if key == "__metadata__":
                continue
            n = 1
            for d in entry["shape"]:
                n *= d
            counts[entry["dtype"]] = counts.get(entry["dtype"], 0) + n
    return {"parameters": counts, "total": sum(counts.values())} if counts else None


@dataclass
class HubServer:
    models: dict[str, Repo] = field(default_factory=dict)
    datasets: dict[str, Repo] = field(default_factory=dict)
    token: str = "hf_test_token_0123456789"
    delay_per_byte: float = 0.0
    requests: list[tuple[str, str]] = field(default_factory=list)
    url: str = ""
    _httpd: ThreadingHTTPServer | None = None

    def start(self) -> HubServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                server._handle(self, body=True)

            def do_HEAD(self) -> None:
                server._handle(self, body=False)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                server._handle(self, body=True)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    # ------------------------------------------------------------------------------------ routing

    def _handle(self, h: BaseHTTPRequestHandler, *, body: bool) -> None:
        parts = urlsplit(h.path)
        path = unquote(parts.path)
        self.requests.append((h.command, path))
        query = parse_qs(parts.query)
        m = re.match(
            r"^/api/(models|datasets)/([^/]+/[^/]+)(?:/(revision|tree|paths-info)/([^/]+)(/.*)?)?$", path
        )
        if m:
            kind, repo_id, what, rev, sub = m.groups()
            self._api(h, kind, repo_id, what, unquote(rev or "main"), (sub or "").strip("/"), query, body)
            return
        m = re.match(r"^/api/(models|datasets)$", path)
        if m:  # search: the public repos whose id holds the text
            found = self.models if m.group(1) == "models" else self.datasets
            text = query.get("search", [""])[0].lower()
            hits = [r for r, repo in found.items() if text in r.lower() and not repo.private]
            self._json(h, [{"id": r, "modelId": r, "private": False} for r in sorted(hits)], body)
            return
        m = re.match(r"^/(datasets/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if m:
            kind = "datasets" if m.group(1) else "models"
            self._resolve(h, kind, m.group(2), unquote(m.group(3)), m.group(4), body)
            return
        self._error(h, 404, "RepoNotFound", "not found", body)

    def _repo(self, h: BaseHTTPRequestHandler, kind: str, repo_id: str, body: bool) -> Repo | None:
        repo = (self.models if kind == "models" else self.datasets).get(repo_id)
        authed = h.headers.get("Authorization") == f"Bearer {self.token}"
        if repo is None or (repo.private and not authed):
            self._error(h, 401, "RepoNotFound", "Repository not found", body)
            return None
        return repo

    def _api(
        self,
        h: BaseHTTPRequestHandler,
        kind: str,
        repo_id: str,
        what: str | None,
        rev: str,
        sub: str,
        query: dict[str, list[str]],
        body: bool,
    ) -> None:
        repo = self._repo(h, kind, repo_id, body)
        if repo is None:
            return
        name = repo.find(rev)
        if name is None:
            self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {rev}", body)
            return
        files, sha = repo.revisions[name], repo.sha(name)
        if what == "tree":
            recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
            self._json(h, self._tree(files, sub, recursive), body)
            return
        if what == "paths-info":
            self._json(h, [self._entry(p, files[p]) for p in files], body)
            return
        info: dict[str, Any] = {
            "id": repo_id,
            "modelId" if kind == "models" else "id": repo_id,
            "sha": sha,
            "private": repo.private,
            "gated": "manual" if repo.gated else False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "lastModified": "2026-01-01T00:00:00.000Z",
            "siblings": [{"rfilename": p} for p in sorted(files)],
        }
        st = safetensors_parameters(files)
        if kind == "models" and st is not None:
            info["safetensors"] = st
        self._json(h, info, body)

    @staticmethod
    def _entry(path: str, blob: bytes) -> dict[str, Any]:
        oid = hashlib.sha1(b"blob %d\0" % len(blob) + blob).hexdigest()
        return {"type": "file", "oid": oid, "size": len(blob), "path": path}

    def _tree(self, files: dict[str, bytes], sub: str, recursive: bool) -> list[dict[str, Any]]:
        prefix = f"{sub}/" if sub else ""
        out: list[dict[str, Any]] = []
        dirs: set[str] = set()
        for p in sorted(files):
            if not p.startswith(prefix):
                continue
            rest = p[len(prefix) :]
            if "/" in rest:
                top = prefix + rest.split("/")[0]
                if top not in dirs:
                    dirs.add(top)
                    out.append(
                        {"type": "directory", "oid": hashlib.sha1(top.encode()).hexdigest(), "path": top}
                    )
                if not recursive:
                    continue
            out.append(self._entry(p, files[p]))
        return out

    def _resolve(
        self, h: BaseHTTPRequestHandler, kind: str, repo_id: str, rev: str, filename: str, body: bool
    ) -> None:
        repo = self._repo(h, kind, repo_id, body)
        if repo is None:
            return
        if repo.gated and h.headers.get("Authorization") != f"Bearer {self.token}":
            self._error(h, 401, "GatedRepo", f"Access to model {repo_id} is restricted.", body)
            return
        name = repo.find(rev)
        if name is None:
            self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {rev}", body)
            return
        files = repo.revisions[name]
        if filename not in files:
            self._error(h, 404, "EntryNotFound", f"{filename} does not exist", body)
            return
        blob = files[filename]
        start, end, status = 0, len(blob) - 1, 200
        m = re.match(r"bytes=(\d*)-(\d*)", h.headers.get("Range") or "")
        if m and blob:
            if m.group(1):
                start = int(m.group(1))
                end = min(int(m.group(2)), end) if m.group(2) else end
            else:  # a suffix: the last N bytes
                start = max(0, len(blob) - int(m.group(2)))
            status = 206
        chunk = blob[start : end + 1]
        h.send_response(status)
        h.send_header("ETag", f'"{hashlib.sha256(blob).hexdigest()}"')
        h.send_header("X-Repo-Commit", repo.sha(name))
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Length", str(len(chunk) if body or status == 206 else len(blob)))
        if status == 206:
            h.send_header("Content-Range", f"bytes {start}-{end}/{len(blob)}")
        h.end_headers()
        if body:
            self._write(h, chunk)

    # ----------------------------------------------------------------------------------- replies

    def _write(self, h: BaseHTTPRequestHandler, data: bytes) -> None:
        if not self.delay_per_byte:
            h.wfile.write(data)
            return
        step = 4096
        for i in range(0, len(data), step):
            h.wfile.write(data[i : i + step])
            h.wfile.flush()
            time.sleep(self.delay_per_byte * len(data[i : i + step]))

    def _json(self, h: BaseHTTPRequestHandler, obj: Any, body: bool) -> None:
        data = json.dumps(obj).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if body:
            h.wfile.write(data)

    def _error(self, h: BaseHTTPRequestHandler, status: int, code: str, message: str, body: bool) -> None:
        data = json.dumps({"error": message}).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", message)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if body:
            h.wfile.write(data)
