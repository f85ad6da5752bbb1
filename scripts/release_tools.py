#!/usr/bin/env python3
"""The parts of `scripts/release` that write or check bytes: the static-binary check, the
CycloneDX SBOM, the licence file, the OCI image archive. Standard library only.

Every output is a function of its inputs and SOURCE_DATE_EPOCH alone: no clock, no build path,
no user or host name, sorted where an order could vary, so two runs from two clones agree."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import struct
import subprocess
import sys
import tarfile
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

# Debian and OCI names of the Rust targets' architectures, and the ELF machine of each.
ARCH = {
    "x86_64-unknown-linux-musl": {"deb": "amd64", "oci": "amd64", "variant": "", "e_machine": 62},
    "aarch64-unknown-linux-musl": {"deb": "arm64", "oci": "arm64", "variant": "v8", "e_machine": 183},
}
LICENCE_FILE = re.compile(r"^(LICEN[CS]E|COPYING|COPYRIGHT|NOTICE|UNLICENSE)([-_.].*)?$", re.IGNORECASE)


def fail(msg: str) -> None:
    print(f"scripts/release: {msg}", file=sys.stderr)
    sys.exit(1)


def epoch() -> int:
    value = os.environ.get("SOURCE_DATE_EPOCH", "")
    if not value.isdigit():
        fail("SOURCE_DATE_EPOCH is not set: scripts/release sets it from the commit")
    return int(value)


def iso(t: int) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- the static binary ---------------------------------------------------------------------


def check_static(path: Path, target: str, max_bytes: int, forbidden: list[str]) -> None:
    """A static ELF of the target's machine: no PT_INTERP, no PT_DYNAMIC, no .dynamic section,
    no build path in its bytes, within the size goal."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        fail(f"{path}: not a 64-bit little-endian ELF file")
    e_machine = struct.unpack_from("<H", data, 18)[0]
    if e_machine != ARCH[target]["e_machine"]:
        fail(f"{path}: ELF machine {e_machine}, not {target}'s {ARCH[target]['e_machine']}")
    phoff, shoff = struct.unpack_from("<QQ", data, 32)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 54)
    for i in range(phnum):
        p_type = struct.unpack_from("<I", data, phoff + i * phentsize)[0]
        if p_type == 3:
            fail(f"{path}: has an ELF interpreter (PT_INTERP): the build is not static")
        if p_type == 2:
            fail(f"{path}: has a dynamic segment (PT_DYNAMIC): the build is not static")
    for i in range(shnum):
        sh_type = struct.unpack_from("<I", data, shoff + i * shentsize + 4)[0]
        if sh_type == 6:
            fail(f"{path}: has a .dynamic section: the build is not static")
    for p in forbidden:
        if p and p.encode() in data:
            fail(f"{path}: holds the build path {p}: a --remap-path-prefix is missing")
    if len(data) > max_bytes:
        fail(f"{path}: {len(data)} bytes, over the goal of {max_bytes}")


# --- the crates linked in ------------------------------------------------------------------


@dataclass
class Crate:
    name: str
    version: str
    licence: str
    checksum: str | None
    source_dir: Path
    description: str
    repository: str | None
    deps: set[str] = field(default_factory=set)

    @property
    def ref(self) -> str:
        return f"pkg:cargo/{self.name}@{self.version}"


def linked_crates(root_dir: Path, target: str) -> tuple[Crate, list[Crate]]:
    """The package and the crates compiled into its binary for `target`: `cargo tree` over
    normal dependencies without proc-macros (`cargo metadata` alone would add crates that only
    dev-dependencies' features pull in). Details come from `cargo metadata` and Cargo.lock."""
    tree = subprocess.run(
        ["cargo", "tree", "--locked", "-e", "normal,no-proc-macro", "--target", target,
         "--prefix", "depth", "-f", "{p}"],
        cwd=root_dir, check=True, capture_output=True, text=True,
    ).stdout
    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "--locked", "--format-version", "1", "--filter-platform", target],
        cwd=root_dir, check=True, capture_output=True, text=True,
    ).stdout)
    by_key = {(p["name"], p["version"]): p for p in meta["packages"]}
    lock = (root_dir / "Cargo.lock").read_text()
    sums = {(n, v): c for n, v, c in re.findall(
        r'name = "([^"]+)"\nversion = "([^"]+)"\nsource = "[^"]+"\nchecksum = "([0-9a-f]+)"', lock)}
    crates: dict[str, Crate] = {}
    stack: list[str] = []
    for line in tree.splitlines():
        m = re.match(r"^(\d+)(\S+) v(\S+)", line)
        if not m:
            continue
        depth, name, version = int(m.group(1)), m.group(2), m.group(3)
        p = by_key.get((name, version))
        if p is None:
            fail(f"cargo tree names {name} {version}, which cargo metadata does not know")
        crate = Crate(
            name=name,
            version=version,
            # Old crates write "MIT/Apache-2.0"; SPDX says "MIT OR Apache-2.0".
            licence=(p.get("license") or "NOASSERTION").replace("/", " OR "),
            checksum=sums.get((name, version)),
            source_dir=Path(p["manifest_path"]).parent,
            description=" ".join((p.get("description") or "").split()),
            repository=p.get("repository"),
        )
        crates.setdefault(crate.ref, crate)
        del stack[depth:]
        if stack:
            crates[stack[-1]].deps.add(crate.ref)
        stack.append(crate.ref)
    if not stack and not crates:
        fail("cargo tree printed no crates")
    root = next(iter(crates.values()))
    return root, sorted((c for c in crates.values() if c is not root), key=lambda c: c.ref)


def sbom(root_dir: Path, target: str, binary: Path, commit: str, out: Path) -> None:
    """CycloneDX 1.5 JSON: the binary as the application, each linked crate as a library with
    its crates.io checksum and licence, and the dependency graph."""
    root, crates = linked_crates(root_dir, target)
    rustc = subprocess.run(["rustc", "-V"], check=True, capture_output=True, text=True).stdout.strip()
    cargo = subprocess.run(["cargo", "-V"], check=True, capture_output=True, text=True).stdout.strip()

    def component(c: Crate, kind: str) -> dict[str, object]:
        d: dict[str, object] = {
            "type": kind,
            "bom-ref": c.ref,
            "name": c.name,
            "version": c.version,
            "description": c.description,
            "licenses": [{"expression": c.licence}],
            "purl": c.ref,
        }
        if c.checksum:
            d["hashes"] = [{"alg": "SHA-256", "content": c.checksum}]
        if c.repository:
            d["externalReferences"] = [{"type": "vcs", "url": c.repository}]
        return d

    app = component(root, "application")
    app["hashes"] = [{"alg": "SHA-256", "content": sha256(binary.read_bytes())}]
    app["properties"] = [
        {"name": "cdx:rustc:target", "value": target},
        {"name": "git:commit", "value": commit},
        {"name": "file:name", "value": binary.name},
    ]
    doc = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        # Unique per (version, commit, target), and the same in every rebuild of them.
        "serialNumber": uuid.uuid5(uuid.NAMESPACE_URL, f"quiesce:{root.version}:{commit}:{target}").urn,
        "version": 1,
        "metadata": {
            "timestamp": iso(epoch()),
            "tools": {"components": [
                {"type": "application", "name": "rustc", "version": rustc.removeprefix("rustc ")},
                {"type": "application", "name": "cargo", "version": cargo.removeprefix("cargo ")},
            ]},
            "component": app,
        },
        "components": [component(c, "library") for c in crates],
        "dependencies": [
            {"ref": c.ref, "dependsOn": sorted(c.deps)} for c in [root, *crates]
        ],
    }
    out.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def licences(root_dir: Path, targets: list[str], out: Path) -> None:
    """quiesce's licence, then every linked crate's licence files as the crate ships them (the
    BSD-3-Clause ones ask that their notice go with every binary)."""
    own = ["LICENSE-MIT", "LICENSE-APACHE"]
    parts = [
        "quiesce is licensed under the MIT licence or the Apache License 2.0, at your option.\n"
        "Its binaries link the crates listed below; each crate's licence follows its name.\n"
    ]
    for name in own:
        parts.append(f"\n{'=' * 78}\nquiesce: {name}\n{'=' * 78}\n\n{(root_dir / name).read_text()}")
    seen: dict[str, Crate] = {}
    for t in targets:
        for c in linked_crates(root_dir, t)[1]:
            seen.setdefault(c.ref, c)
    for c in sorted(seen.values(), key=lambda c: c.ref):
        files = sorted(f for f in c.source_dir.iterdir() if f.is_file() and LICENCE_FILE.match(f.name))
        parts.append(f"\n{'=' * 78}\n{c.name} {c.version}: {c.licence}\n{'=' * 78}\n")
        if not files:
            parts.append("\n(the crate ships no licence file; its licence is the SPDX expression above)\n")
        for f in files:
            parts.append(f"\n--- {c.name}-{c.version}/{f.name}\n\n{f.read_text(errors='replace')}")
    out.write_text("".join(parts))


# --- the OCI image archive -----------------------------------------------------------------


def tar_bytes(entries: list[tuple[str, bytes, int]], mtime: int) -> bytes:
    """A tar of (name, data, mode) regular files, in the given order, owned by 0:0."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        dirs: set[str] = set()
        for name, data, mode in entries:
            parent = ""
            for part in name.split("/")[:-1]:
                parent = f"{parent}{part}/"
                if parent not in dirs:
                    dirs.add(parent)
                    d = tarfile.TarInfo(parent)
                    d.type, d.mode, d.mtime = tarfile.DIRTYPE, 0o755, mtime
                    tar.addfile(d)
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, mtime
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def oci(binary: Path, target: str, version: str, commit: str, source: str, out: Path) -> None:
    """An OCI image layout in a tar, which is also a `docker save` archive (its manifest.json
    names the same blobs): the FROM scratch stage, /quiesce alone, labelled. The layer is an
    uncompressed tar, so its bytes do not depend on a compressor's version."""
    t = epoch()
    arch = ARCH[target]
    ref = f"quiesce:{version}"
    labels = {
        "org.opencontainers.image.title": "quiesce",
        "org.opencontainers.image.description": "A static container init that proves the sandbox "
        "user's processes are gone before the verifier runs; COPY --from this image /quiesce",
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.revision": commit,
        "org.opencontainers.image.source": source,
        "org.opencontainers.image.licenses": "MIT OR Apache-2.0",
        "org.opencontainers.image.created": iso(t),
    }
    layer = tar_bytes([("quiesce", binary.read_bytes(), 0o755)], t)
    layer_digest = "sha256:" + sha256(layer)
    platform: dict[str, str] = {"architecture": arch["oci"], "os": "linux"}
    if arch["variant"]:
        platform["variant"] = arch["variant"]
    config = canonical({
        **platform,
        "created": iso(t),
        "config": {"Entrypoint": ["/quiesce"], "Labels": labels},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created": iso(t), "created_by": "COPY quiesce /quiesce # scripts/release"}],
    })
    config_digest = "sha256:" + sha256(config)
    manifest = canonical({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer_digest, "size": len(layer)}],
        "annotations": labels,
    })
    manifest_digest = "sha256:" + sha256(manifest)
    index = canonical({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": len(manifest),
            "platform": platform,
            "annotations": {"org.opencontainers.image.ref.name": version,
                            "io.containerd.image.name": ref},
        }],
    })

    def blob(digest: str) -> str:
        return "blobs/sha256/" + digest.removeprefix("sha256:")

    docker_manifest = canonical([{"Config": blob(config_digest), "RepoTags": [ref],
                                  "Layers": [blob(layer_digest)]}])
    out.write_bytes(tar_bytes([
        ("oci-layout", canonical({"imageLayoutVersion": "1.0.0"}), 0o644),
        ("index.json", index, 0o644),
        ("manifest.json", docker_manifest, 0o644),
        (blob(config_digest), config, 0o644),
        (blob(layer_digest), layer, 0o644),
        (blob(manifest_digest), manifest, 0o644),
    ], t))


def main(argv: list[str]) -> None:
    cmd, args = argv[0], argv[1:]
    if cmd == "check-static":
        path, target, max_bytes, *forbidden = args
        check_static(Path(path), target, int(max_bytes), forbidden)
    elif cmd == "sbom":
        root_dir, target, binary, commit, out = args
        sbom(Path(root_dir), target, Path(binary), commit, Path(out))
    elif cmd == "licences":
        root_dir, out, *targets = args
        licences(Path(root_dir), targets, Path(out))
    elif cmd == "oci":
        binary, target, version, commit, source, out = args
        oci(Path(binary), target, version, commit, source, Path(out))
    elif cmd == "deb-arch":
        print(ARCH[args[0]]["deb"])
    else:
        fail(f"release_tools.py: unknown step {cmd}")


if __name__ == "__main__":
    main(sys.argv[1:])
