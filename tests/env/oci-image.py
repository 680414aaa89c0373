#!/usr/bin/env python3
"""Writes a one-layer OCI image archive (the layout `ctr images import` reads) from local files.

    oci-image.py OUT.tar NAME [--file SRC:DEST[:MODE]]... [--dir DEST[:MODE]]... [--text DEST=CONTENT]...
                 [--user UID:GID] [--entrypoint JSON] [--cmd JSON] [--port N/tcp] [--env K=V]...

The layer is an uncompressed tar with fixed timestamps and root ownership, so the same inputs
give the same image digest. The node's images (the pause container, skyport's test image) are
written this way because no registry is reachable here and nothing needs a daemon.
"""
import argparse
import hashlib
import io
import json
import tarfile

EPOCH = 0


def add_dirs(tar, seen, path):
    parts = path.strip("/").split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if d not in seen:
            seen.add(d)
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, EPOCH
            tar.addfile(info)


def layer(files, dirs, texts):
    buf = io.BytesIO()
    seen = set()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dest, mode in dirs:
            add_dirs(tar, seen, dest + "/x")
            d = dest.strip("/")
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, EPOCH
            tar.addfile(info)
        for dest, data, mode in [(d, open(s, "rb").read(), m) for s, d, m in files] + texts:
            add_dirs(tar, seen, dest)
            info = tarfile.TarInfo(dest.strip("/"))
            info.size, info.mode, info.mtime = len(data), mode, EPOCH
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def blob(tar, data):
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size, info.mtime = len(data), EPOCH
    tar.addfile(info, io.BytesIO(data))
    return f"sha256:{digest}", len(data)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("name", help="full reference, e.g. registry.k8s.io/pause:3.10.2")
    p.add_argument("--file", action="append", default=[])
    p.add_argument("--dir", action="append", default=[])
    p.add_argument("--text", action="append", default=[])
    p.add_argument("--user", default="")
    p.add_argument("--entrypoint", default="null")
    p.add_argument("--cmd", default="null")
    p.add_argument("--port", action="append", default=[])
    p.add_argument("--env", action="append", default=[])
    a = p.parse_args()

    files = []
    for spec in a.file:
        src, dest, *mode = spec.split(":")
        files.append((src, dest, int(mode[0], 8) if mode else 0o755))
    dirs = []
    for spec in a.dir:
        dest, *mode = spec.split(":")
        dirs.append((dest, int(mode[0], 8) if mode else 0o755))
    texts = [(t.split("=", 1)[0], t.split("=", 1)[1].encode(), 0o644) for t in a.text]

    data = layer(files, dirs, texts)
    diff_id = "sha256:" + hashlib.sha256(data).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "User": a.user,
            "Entrypoint": json.loads(a.entrypoint),
            "Cmd": json.loads(a.cmd),
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"] + a.env,
            "ExposedPorts": {port: {} for port in a.port},
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "tests/env/oci-image.py"}],
    }
    with tarfile.open(a.out, "w") as tar:
        layer_digest, layer_size = blob(tar, data)
        cfg = json.dumps(config, sort_keys=True).encode()
        cfg_digest, cfg_size = blob(tar, cfg)
        manifest = json.dumps({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": cfg_digest, "size": cfg_size},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                        "digest": layer_digest, "size": layer_size}],
        }, sort_keys=True).encode()
        man_digest, man_size = blob(tar, manifest)
        index = json.dumps({
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": man_digest, "size": man_size,
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {"io.containerd.image.name": a.name,
                                "org.opencontainers.image.ref.name": a.name.rsplit(":", 1)[-1]},
            }],
        }).encode()
        for name, body in (("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", index)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(body), EPOCH
            tar.addfile(info, io.BytesIO(body))


if __name__ == "__main__":
    main()
