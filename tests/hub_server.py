"""Loopback HTTP servers that answer like the Hugging Face Hub's file endpoints (`HF_ENDPOINT`), Kaggle's
Models API (`KaggleServer`) and a plain file server.

`HubServer` serves repositories held in memory, `{repo_id: {path: bytes}}`, at one commit each, through
the three routes `huggingface_hub` uses to download a snapshot:

    GET  /api/models/{repo}[/revision/{revision}] its commit `sha` and files: sizes, git blob ids, LFS sha256
    HEAD /{repo}/resolve/{revision}/{path}        X-Repo-Commit, ETag, size
    GET  /{repo}/resolve/{revision}/{path}        the file, or the part a `Range: bytes=N-` header asks

and the routes `huggingface_hub` uploads through (`HfApi.create_repo` and `create_commit` without
Xet, i.e. with `HF_HUB_DISABLE_XET`: the Xet storage protocol is not served):

    POST /api/repos/create                        {"name", "organization"}: an empty repository, 409 if it exists
    POST /api/validate-yaml                       a README's front matter: always valid
    POST /api/models/{repo}/preupload/{revision}  each file's upload mode ("lfs" for LFS_SUFFIXES), remote oid
    POST /{repo}.git/info/lfs/objects/batch       LFS batch: a `basic` upload href per object not yet stored
    PUT  /lfs-upload/{sha256}                     the object, kept when its sha256 is its name
    POST /api/models/{repo}/commit/{revision}     the NDJSON commit (header, file, lfsFile, deletedFile), applied
                                                  whole or not at all; a `parentCommit` other than the head: 412

A commit replaces the repository's files and commit id, so the same server then serves them.
`faults[(repo, "commit")] = "fail"` makes the commit route answer 500 and change nothing.
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
        # Polled every 10 ms for `shutdown` (the default 0.5 s made each server's teardown last ~1 s).
        threading.Thread(target=self._server.serve_forever, kwargs=dict(poll_interval=0.01), daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()


def commit_id(files):
    """A commit id for a repository state (a sha1 of its paths and contents)."""
    return hashlib.sha1(repr(sorted((p, hashlib.sha256(c).hexdigest()) for p, c in files.items())).encode()).hexdigest()


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

    def _body(self):
        """The request's body, sent with a Content-Length or chunked (a streamed upload)."""
        if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))
        chunks = []
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(chunks)
            chunks.append(self.rfile.read(size))
            self.rfile.readline()


class HubServer(_LoopbackServer):
    """`with HubServer(repos) as server:` serves `repos` at `server.endpoint` until the block ends."""

    def __init__(self, repos):
        self.repos = repos
        self.faults = {}
        self.requests = []
        self.commits = {repo: commit_id(files) for repo, files in repos.items()}
        self.lfs = {}  # sha256 -> bytes: LFS objects uploaded, before a commit names them
        super().__init__(self._handler())

    def _preupload(self, repo, body):
        files = self.repos[repo]
        return {"files": [{"path": f["path"], "uploadMode": "lfs" if f["path"].endswith(LFS_SUFFIXES) else "regular",
                           "shouldIgnore": False,
                           "oid": etag(f["path"], files[f["path"]]) if f["path"] in files else None}
                          for f in body["files"]]}

    def _lfs_batch(self, body):
        base = self.endpoint
        return {"transfer": "basic", "objects": [
            {"oid": o["oid"], "size": o["size"], "authenticated": True,
             **({} if o["oid"] in self.lfs else {"actions": {"upload": {"href": f"{base}/lfs-upload/{o['oid']}"}}})}
            for o in body["objects"]]}

    def _commit(self, repo, revision, lines):
        """Applies an NDJSON commit to a copy of `repo`'s files: `(status, answer)`; the repository changes
        only when every operation is valid."""
        if revision != "main":
            return 400, {"error": f"Only the main branch takes commits here, not {revision!r}."}
        if self.faults.get((repo, "commit")) == "fail":
            return 500, {"error": "Internal Error - We're working hard to fix this as soon as possible!"}
        files = dict(self.repos[repo])
        for line in lines:
            key, value = line["key"], line["value"]
            if key == "header":
                parent = value.get("parentCommit")
                if parent is not None and parent != self.commits[repo]:
                    return 412, {"error": f"The branch moved: parent commit {parent} is not the head."}
            elif key == "file":
                files[value["path"]] = base64.b64decode(value["content"])
            elif key == "lfsFile":
                if value["oid"] not in self.lfs:
                    return 422, {"error": f"LFS object {value['oid']} of {value['path']!r} was never uploaded."}
                files[value["path"]] = self.lfs[value["oid"]]
            elif key == "deletedFile":
                files.pop(value["path"], None)
            else:
                return 400, {"error": f"Unknown commit operation {key!r}."}
        self.repos[repo] = files
        self.commits[repo] = commit_id(files)
        return 200, {"success": True, "commitOid": self.commits[repo],
                     "commitUrl": f"{self.endpoint}/{repo}/commit/{self.commits[repo]}"}

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

            def do_POST(self):
                path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
                hub.requests.append((self.command, path))
                raw = self._body()
                parts = path.strip("/").split("/")
                if path == "/api/repos/create":
                    body = json.loads(raw)
                    repo = f"{body.get('organization')}/{body['name']}"
                    if repo in hub.repos:
                        return self._json({"error": "You already created this model repo", "url": repo}, 409)
                    hub.repos[repo], hub.commits[repo] = {}, commit_id({})
                    return self._json({"url": f"{hub.endpoint}/{repo}", "name": repo})
                if path == "/api/validate-yaml":
                    return self._json({"errors": [], "warnings": []})
                if path.endswith(".git/info/lfs/objects/batch"):
                    return self._json(hub._lfs_batch(json.loads(raw)))
                if parts[:2] == ["api", "models"] and len(parts) == 6 and parts[4] in ("preupload", "commit"):
                    repo, revision = "/".join(parts[2:4]), parts[5]
                    if repo not in hub.repos:
                        return self._send(404, b'{"error": "Repository not found"}', [("X-Error-Code", "RepoNotFound")])
                    if parts[4] == "preupload":
                        return self._json(hub._preupload(repo, json.loads(raw)))
                    status, answer = hub._commit(repo, revision, [json.loads(line) for line in raw.splitlines()
                                                                  if line.strip()])
                    return self._json(answer, status)
                return self._send(404, b"")

            def do_PUT(self):
                path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
                hub.requests.append((self.command, path))
                content, oid = self._body(), path.rpartition("/")[2]
                if not path.startswith("/lfs-upload/") or hashlib.sha256(content).hexdigest() != oid:
                    return self._json({"error": f"The upload is not the object {oid}."}, 400)
                hub.lfs[oid] = content
                return self._send(200, b"")

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

    and the calls of `kagglehub.model_upload`, which create a version from uploaded blobs:

        GetModel                       -> the model, or a 404 (then CreateModel)
        CreateModel                    -> {"ref", "url"}
        blobs.BlobApiService/StartBlobUpload -> {"token", "createUrl"}: a PUT to `createUrl` (with a
                                          `Content-Range`) stores the bytes under the token
        CreateModelInstance            -> version 1 of a new variation from the tokens of `body.files`
                                          and `body.directories`; {"error", "errorCode": 409} if it exists
        CreateModelInstanceVersion     -> the next version of the variation

    An unknown model, version or file gets a 404 with `{"code": 404, "message"}`. kagglehub
    reaches a server only at fixed addresses (`KAGGLE_API_ENVIRONMENT`: LOCALHOST is
    `http://localhost`), so the tests send it here as an HTTP proxy (`HTTP_PROXY`); requests
    then name the absolute URL, which the handler reads the path of.
    """

    PREFIX = "/api/v1/models.ModelApiService/"

    def __init__(self, models):
        self.models = models
        self.requests = []
        self.created = set()  # "owner/model" made by CreateModel
        self.blobs = {}  # token -> [name, bytes]
        self.licences = {}  # "owner/model/framework/variation" -> the licenseName it was created with
        super().__init__(self._handler())

    def _files(self, directory, prefix=""):
        """`{path: bytes}` of an `ApiUploadDirectoryInfo`'s file tokens, its subdirectories' under their names."""
        found = {prefix + self.blobs[f["token"]][0]: self.blobs[f["token"]][1] for f in directory.get("files", [])}
        for sub in directory.get("directories", []):
            found.update(self._files(sub, f"{prefix}{sub['name']}/"))
        return found

    def _upload(self, method, body):
        """The answer to one of `model_upload`'s calls, or None for a method that is not one."""
        owner, model = body.get("ownerSlug"), body.get("modelSlug", body.get("slug"))
        if method == "GetModel":
            known = f"{owner}/{model}" in self.created or any(k.startswith(f"{owner}/{model}/") for k in self.models)
            return ({"ownerSlug": owner, "slug": model} if known
                    else {"code": 404, "message": f"No model {owner}/{model}."}), 200 if known else 404
        if method == "CreateModel":
            self.created.add(f"{owner}/{model}")
            return {"ref": f"{owner}/{model}", "url": f"{self.endpoint}/models/{owner}/{model}"}, 200
        if method == "StartBlobUpload":
            token = f"blob-{len(self.blobs)}"
            self.blobs[token] = [body["name"], b""]
            return {"token": token, "createUrl": f"{self.endpoint}/upload/{token}"}, 200
        if method not in ("CreateModelInstance", "CreateModelInstanceVersion"):
            return None
        upload = body["body"]
        framework = (upload if method == "CreateModelInstance" else body)["framework"]
        instance = (upload if method == "CreateModelInstance" else body)["instanceSlug"]
        name = f"{owner}/{model}/{framework.removeprefix('MODEL_FRAMEWORK_').lower()}/{instance}"
        if method == "CreateModelInstance" and name in self.models:
            return {"error": f"Model instance {name} already exists.", "errorCode": 409}, 200
        if method == "CreateModelInstanceVersion" and name not in self.models:
            return {"code": 404, "message": f"No model instance {name}."}, 404
        if method == "CreateModelInstance":
            self.licences[name] = upload.get("licenseName")
        versions = self.models.setdefault(name, {})
        number = max(versions, default=0) + 1
        versions[number] = self._files(upload)
        return {"ref": f"{name}/{number}", "url": f"{self.endpoint}/models/{name}/{number}"}, 200

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
            def do_PUT(self):  # a blob's bytes, at the `createUrl` StartBlobUpload gave
                token = urllib.parse.urlsplit(self.path).path.rpartition("/")[2]
                kaggle.requests.append(("PUT", token))
                if token not in kaggle.blobs:
                    return self._json({"code": 404, "message": f"No upload {token}."}, 404)
                content = self._body()
                start = re.match(r"bytes (\d+)-", self.headers.get("Content-Range", "")) if content else None
                offset = int(start.group(1)) if start else 0
                kaggle.blobs[token][1] = kaggle.blobs[token][1][:offset] + content
                return self._json({})

            def do_POST(self):
                path = urllib.parse.urlsplit(self.path).path
                body = json.loads(self._body() or b"{}")
                method = path.rpartition("/")[2]
                kaggle.requests.append((method, body.get("path")))
                answer = kaggle._upload(method, body)
                if answer is not None:
                    return self._json(*answer)
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
