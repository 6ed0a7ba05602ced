"""Loopback HTTP servers that answer like the Hugging Face Hub's file endpoints (`HF_ENDPOINT`), Kaggle's
Models API (`KaggleServer`) and a plain file server.

`HubServer` serves repositories held in memory, `{repo_id: {path: bytes}}`, at one commit each, through
the three routes `huggingface_hub` uses to download a snapshot:

    GET  /api/models/{repo}[/revision/{revision}] its commit `sha` and files: sizes, git blob ids, LFS sha256
    HEAD /{repo}/resolve/{revision}/{path}        X-Repo-Commit, ETag, size
    GET  /{repo}/resolve/{revision}/{path}        the file, or the part a `Range: bytes=N-` header asks

Binary files (weights) are described as LFS files, as on the Hub: their ETag and `lfs.oid` are
the sha256 of the content; other files' are the git blob id. `faults` makes the server misbehave
for one path: `"corrupt"` serves other bytes of the right length, `"truncate"` closes the
connection halfway through the body and, like a server gone away, sends nothing to the requests
that try to resume. A fault lasts until it is removed from `faults`.
"""

import base64
import hashlib
import http.server
import json
import re
import threading
import urllib.parse

LFS_SUFFIXES = (".h5", ".safetensors", ".bin", ".pt", ".npz")


def git_blob_id(content):
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def sibling(path, content):
    """The Hub's description of a file in `/api/models/{repo}/revision/{revision}?blobs=true`."""
    entry = {"rfilename": path, "blobId": git_blob_id(content), "size": len(content)}
    if path.endswith(LFS_SUFFIXES):
        entry["lfs"] = {"sha256": hashlib.sha256(content).hexdigest(), "size": len(content), "pointerSize": 134}
    return entry


def etag(path, content):
    entry = sibling(path, content)
    return entry["lfs"]["sha256"] if "lfs" in entry else entry["blobId"]


class _LoopbackServer:
    """A threaded HTTP server on 127.0.0.1 (a free port) that serves while its `with` block runs."""

    def __init__(self, handler):
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()


class _Handler(http.server.BaseHTTPRequestHandler):
    """HTTP/1.1 (kept-alive connections, as the clients use), quiet, with a body-and-length sender."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _send(self, status, body=b"", headers=(), head=False):
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, value, status=200):
        self._send(status, json.dumps(value).encode(), [("Content-Type", "application/json")])


class HubServer(_LoopbackServer):
    """`with HubServer(repos) as server:` serves `repos` at `server.endpoint` until the block ends."""

    def __init__(self, repos):
        self.repos = repos
        self.faults = {}
        self.requests = []
        self.commits = {repo: hashlib.sha1(repr(sorted((p, hashlib.sha256(c).hexdigest())
                                                         for p, c in files.items())).encode()).hexdigest()
                        for repo, files in repos.items()}
        super().__init__(self._handler())

    def _resolve(self, repo, revision):
        if repo not in self.repos or revision not in ("main", self.commits[repo]):
            return None
        return self.commits[repo]

    def _handler(self):
        hub = self

        class Handler(_Handler):
            def _route(self, head):
                path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
                hub.requests.append((self.command, path))
                parts = path.strip("/").split("/")
                if parts[:2] == ["api", "models"] and (len(parts) == 4 or len(parts) == 6 and parts[4] == "revision"):
                    repo, revision = "/".join(parts[2:4]), parts[5] if len(parts) == 6 else "main"
                    if repo not in hub.repos:
                        return self._send(404, b'{"error": "Repository not found"}', [("X-Error-Code", "RepoNotFound")])
                    commit = hub._resolve(repo, revision)
                    if commit is None:
                        return self._send(404, b'{"error": "Invalid rev id"}', [("X-Error-Code", "RevisionNotFound")])
                    files = hub.repos[repo]
                    return self._json({"id": repo, "sha": commit, "private": False,
                                       "siblings": [sibling(p, c) for p, c in sorted(files.items())]})
                if len(parts) >= 5 and parts[2] == "resolve":
                    repo, revision, name = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
                    commit = hub._resolve(repo, revision)
                    if commit is None or name not in hub.repos[repo]:
                        return self._send(404, b"", [("X-Error-Code", "EntryNotFound")], head)
                    content = hub.repos[repo][name]
                    headers = [("X-Repo-Commit", commit), ("ETag", f'"{etag(name, content)}"'),
                               ("Content-Type", "application/octet-stream")]
                    start = 0
                    ranged = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
                    if ranged and not head:
                        start = int(ranged.group(1))
                        headers.append(("Content-Range", f"bytes {start}-{len(content) - 1}/{len(content)}"))
                    status = 206 if ranged and not head else 200
                    fault = None if head else hub.faults.get((repo, name))
                    if fault is None:
                        return self._send(status, content[start:], headers, head)
                    if fault == "corrupt":
                        return self._send(status, bytes(b ^ 0xFF for b in content[start:]), headers)
                    self.send_response(status)  # "truncate": announce every byte, send half (none to a resume)
                    for key, value in headers:
                        self.send_header(key, value)
                    self.send_header("Content-Length", str(len(content) - start))
                    self.end_headers()
                    self.wfile.write(content[start: start + (len(content) // 2 if start == 0 else 0)])
                    self.wfile.flush()
                    self.close_connection = True
                    return None
                return self._send(404, b"")

            def do_GET(self):
                self._route(head=False)

            def do_HEAD(self):
                self._route(head=True)

        return Handler


class FileServer(_LoopbackServer):
    """`with FileServer(directory) as server:` serves `directory`'s files at `server.url(name)` (plain HTTP GET)."""

    def __init__(self, directory):
        self.requests = []
        requests = self.requests

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=str(directory), **kwargs)

            def log_message(self, *args):
                requests.append(self.path)

        super().__init__(Handler)

    def url(self, name):
        return f"{self.endpoint}/{name}"


class KaggleServer(_LoopbackServer):
    """`with KaggleServer(models) as server:` answers like Kaggle's Models API for `kagglehub`.

    `models` is `{"owner/model/framework/variation": {version: {path: bytes}}}`, the latest
    version the largest. kagglehub sends every call as `POST /api/v1/models.ModelApiService/
    {method}` with a JSON body (camelCase slugs, `framework` as `MODEL_FRAMEWORK_KERAS`):

        GetModelInstance               -> {"versionNumber": latest}  (a handle without a version)
        ListModelInstanceVersionFiles  -> {"files": [{"name", "size"}], "nextPageToken": ""}
        DownloadModelInstanceVersion   -> the file at `path`, with `x-goog-hash: md5=...`, which
                                          kagglehub checks

    An unknown model, version or file gets a 404 with `{"code": 404, "message"}`. kagglehub
    reaches a server only at fixed addresses (`KAGGLE_API_ENVIRONMENT`: LOCALHOST is
    `http://localhost`), so the tests send it here as an HTTP proxy (`HTTP_PROXY`); requests
    then name the absolute URL, which the handler reads the path of.
    """

    PREFIX = "/api/v1/models.ModelApiService/"

    def __init__(self, models):
        self.models = models
        self.requests = []
        super().__init__(self._handler())

    def _version(self, body):
        name = "/".join([body.get("ownerSlug", ""), body.get("modelSlug", ""),
                         body.get("framework", "").removeprefix("MODEL_FRAMEWORK_").lower(),
                         body.get("instanceSlug", "")])
        versions = self.models.get(name)
        if versions is None:
            return None, None
        number = body.get("versionNumber", max(versions))
        return number, versions.get(number)

    def _handler(self):
        kaggle = self

        class Handler(_Handler):
            def do_POST(self):
                path = urllib.parse.urlsplit(self.path).path
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                method = path.removeprefix(kaggle.PREFIX)
                kaggle.requests.append((method, body.get("path")))
                number, files = kaggle._version(body)
                if files is None or not path.startswith(kaggle.PREFIX):
                    return self._json({"code": 404, "message": f"No model version {number} here."}, 404)
                if method == "GetModelInstance":
                    return self._json({"versionNumber": number})
                if method == "ListModelInstanceVersionFiles":
                    return self._json({"files": [{"name": n, "size": len(c)} for n, c in sorted(files.items())],
                                       "nextPageToken": ""})
                content = files.get(body.get("path")) if method == "DownloadModelInstanceVersion" else None
                if content is None:
                    return self._json({"code": 404, "message": f"No file {body.get('path')!r}."}, 404)
                md5 = base64.b64encode(hashlib.md5(content).digest()).decode()
                return self._send(200, content, [("Content-Type", "application/octet-stream"),
                                                 ("x-goog-hash", f"md5={md5}")])

        return Handler
