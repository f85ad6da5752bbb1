#!/usr/bin/env python3
"""The parts of `scripts/release` that write or check bytes: the static-binary check, the
CycloneDX SBOM, the licence file, the OCI image archive, the Python wheel. Standard library only.

Every output is a function of its inputs and SOURCE_DATE_EPOCH alone: no clock, no build path,
no user or host name, sorted where an order could vary, so two runs from two clones agree."""

from __future__ import annotations

import ast
import base64
import hashlib
import io
import json
import os
import re
import struct
import subprocess
import sys
import tarfile
import time
import tomllib
import uuid
import zipfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import NoReturn

# Debian and OCI names of the Rust targets' architectures, and the ELF machine of each.
ARCH = {
    "x86_64-unknown-linux-musl": {"deb": "amd64", "oci": "amd64", "variant": "", "e_machine": 62},
    "aarch64-unknown-linux-musl": {"deb": "arm64", "oci": "arm64", "variant": "v8", "e_machine": 183},
}
LICENCE_FILE = re.compile(r"^(LICEN[CS]E|COPYING|COPYRIGHT|NOTICE|UNLICENSE)([-_.].*)?$", re.IGNORECASE)


def fail(msg: str) -> NoReturn:
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


# --- the Python wheel ----------------------------------------------------------------------

WHEEL_TAG = "py3-none-any"
# One deflate level for every entry: the bytes depend on it (and on zlib, as for every zip).
WHEEL_LEVEL = 9


def cargo_version(root_dir: Path) -> str:
    m = re.search(r'^version = "([^"]+)"$', (root_dir / "Cargo.toml").read_text(), re.MULTILINE)
    if m is None:
        fail(f"{root_dir / 'Cargo.toml'}: no version line")
    return m.group(1)


def kit_version(init_py: Path) -> str:
    """`__version__` of the kit, read from its source (importing it would need its dependencies)."""
    for node in ast.parse(init_py.read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == ["__version__"]:
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value.value
    fail(f"{init_py}: no __version__ = \"...\" line")


def wheel_version(root_dir: Path) -> str:
    """Cargo.toml's version, which the kit's __version__ (and a static pyproject version) must be."""
    version = cargo_version(root_dir)
    kit = kit_version(root_dir / "python/src/quiesce_harness/__init__.py")
    if kit != version:
        fail(f"quiesce_harness.__version__ is {kit} and Cargo.toml's version {version}: "
             "set python/src/quiesce_harness/__init__.py's to the release's")
    project = tomllib.loads((root_dir / "python/pyproject.toml").read_text())["project"]
    if project.get("version", version) != version:
        fail(f"python/pyproject.toml's version is {project['version']}, not Cargo.toml's {version}: "
             "leave it dynamic (from __version__)")
    return version


def tracked_files(root_dir: Path, sub: str) -> list[str]:
    """Files under `sub` that git tracks (never __pycache__ or anything else left in the tree)."""
    out = subprocess.run(["git", "-C", str(root_dir), "ls-files", "-z", "--", sub],
                         check=True, capture_output=True).stdout
    return sorted(f for f in out.decode().split("\0") if f and "__pycache__" not in f.split("/"))


def metadata(project: dict[str, object], version: str, readme: str, licence_files: list[str]) -> str:
    """Core metadata 2.4 (PEP 639: License-Expression, License-File under .dist-info/licenses)."""
    lines = [
        "Metadata-Version: 2.4",
        f"Name: {project['name']}",
        f"Version: {version}",
        f"Summary: {project['description']}",
        f"License-Expression: {project['license']}",
        *(f"License-File: {f}" for f in licence_files),
        f"Requires-Python: {project['requires-python']}",
    ]
    deps = project.get("dependencies", [])
    assert isinstance(deps, list)
    lines += [f"Requires-Dist: {d}" for d in deps]
    extras = project.get("optional-dependencies", {})
    assert isinstance(extras, dict)
    for extra in sorted(extras):
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {d}; extra == "{extra}"' for d in extras[extra]]
    lines.append("Description-Content-Type: text/markdown")
    return "\n".join(lines) + "\n\n" + readme


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def zip_entry(name: str, mode: int, t: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=time.gmtime(max(t, 315532800))[:6])
    info.create_system = 3  # Unix: installers read the mode from the high half of external_attr
    info.external_attr = (0o100000 | mode) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def wheel(root_dir: Path, binaries: list[tuple[str, Path]], licences_txt: Path, out_dir: Path) -> Path:
    """The one pure wheel: the kit (python/src/quiesce_harness, as git tracks it), both static
    binaries as package data (quiesce_harness/bin/quiesce-TARGET, mode 755), and the .dist-info
    (METADATA, WHEEL, entry_points.txt, licences, RECORD last). Entries sorted, the dist-info's
    after the package's (installers read it from the end); times SOURCE_DATE_EPOCH; modes 644
    and 755; deflate at one level."""
    t = epoch()
    pyproject = tomllib.loads((root_dir / "python/pyproject.toml").read_text())
    project = pyproject["project"]
    name = project["name"]
    version = wheel_version(root_dir)
    readme = (root_dir / "python" / project["readme"]).read_text()
    files: list[tuple[str, bytes, int]] = []
    for f in tracked_files(root_dir, "python/src/quiesce_harness"):
        files.append((f.removeprefix("python/src/"), (root_dir / f).read_bytes(), 0o644))
    for target, path in binaries:
        files.append((f"quiesce_harness/bin/quiesce-{target}", path.read_bytes(), 0o755))
    files.sort()
    info = f"{name.replace('-', '_')}-{version}.dist-info"
    licence_files = ["LICENSE-MIT", "LICENSE-APACHE", "LICENSES.txt"]
    sources = [root_dir / "LICENSE-MIT", root_dir / "LICENSE-APACHE", licences_txt]
    scripts = project.get("scripts", {})
    meta = [
        (f"{info}/METADATA", metadata(project, version, readme, licence_files).encode()),
        (f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: quiesce scripts/release_tools.py\n"
                          f"Root-Is-Purelib: true\nTag: {WHEEL_TAG}\n\n".encode()),
        (f"{info}/entry_points.txt", entry_points(scripts, project.get("entry-points", {}))),
        *((f"{info}/licenses/{n}", p.read_bytes()) for n, p in zip(licence_files, sources)),
    ]
    entries = files + sorted((n, d, 0o644) for n, d in meta)
    record = "".join(f"{n},{record_hash(d)},{len(d)}\n" for n, d, _ in entries) + f"{info}/RECORD,,\n"
    entries.append((f"{info}/RECORD", record.encode(), 0o644))
    out = out_dir / f"{name.replace('-', '_')}-{version}-{WHEEL_TAG}.whl"
    with zipfile.ZipFile(out, "w") as z:
        for n, d, mode in entries:
            z.writestr(zip_entry(n, mode, t), d, compresslevel=WHEEL_LEVEL)
    return out


def entry_points(scripts: dict[str, str], groups: dict[str, dict[str, str]]) -> bytes:
    """entry_points.txt: the commands, then each plugin group pyproject names (the harnesses find
    the kit's switches through these), groups and names sorted."""
    every = {"console_scripts": scripts, **groups}
    return "".join(
        f"[{g}]\n" + "".join(f"{k} = {every[g][k]}\n" for k in sorted(every[g])) + "\n"
        for g in sorted(every) if every[g]
    ).encode()


def check_wheel(whl: Path, dist: Path, version: str, root_dir: Path) -> None:
    """The wheel as an installer reads it: RECORD last and naming every entry with its digest and
    size, the binaries 755 and byte for byte dist/'s, everything else 644, the kit exactly the
    files git tracks."""
    info = f"quiesce-{version}.dist-info"
    with zipfile.ZipFile(whl) as z:
        entries = z.infolist()
        names = [e.filename for e in entries]
        if not names or names[-1] != f"{info}/RECORD":
            fail(f"{whl}: its last entry is not {info}/RECORD")
        record: dict[str, str] = {}
        for line in z.read(f"{info}/RECORD").decode().splitlines():
            path, digest, size = line.rsplit(",", 2)
            record[path] = f"{digest},{size}"
        if sorted(record) != sorted(names) or len(set(names)) != len(names):
            fail(f"{whl}: RECORD and the entries differ: {sorted(set(record) ^ set(names))}")
        for e in entries:
            data = z.read(e)
            if e.filename != f"{info}/RECORD" and record[e.filename] != f"{record_hash(data)},{len(data)}":
                fail(f"{whl}: {e.filename} is not what RECORD says")
            want = 0o755 if e.filename.startswith("quiesce_harness/bin/") else 0o644
            if e.create_system != 3 or e.external_attr >> 16 != 0o100000 | want:
                fail(f"{whl}: {e.filename} has mode {e.external_attr >> 16:o}, not {0o100000 | want:o}")
        for target in ARCH:
            if z.read(f"quiesce_harness/bin/quiesce-{target}") != (dist / f"quiesce-{version}-{target}").read_bytes():
                fail(f"{whl}: quiesce_harness/bin/quiesce-{target} is not dist/'s quiesce-{version}-{target}")
        meta = z.read(f"{info}/METADATA").decode()
        if f"\nName: quiesce\nVersion: {version}\n" not in meta:
            fail(f"{whl}: METADATA does not name quiesce {version}")
    kit = {n for n in names if n.startswith("quiesce_harness/") and not n.startswith("quiesce_harness/bin/")}
    tracked = {f.removeprefix("python/src/") for f in tracked_files(root_dir, "python/src/quiesce_harness")}
    if kit != tracked:
        fail(f"{whl}: the kit's files are not the ones git tracks: {sorted(kit ^ tracked)}")


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
    elif cmd == "check-versions":
        # Before any build: the wheel's kit must carry the release's version.
        wheel_version(Path(args[0]))
    elif cmd == "wheel":
        # wheel ROOT LICENCES_TXT OUT_DIR TARGET=BINARY...
        root_dir, licences_txt, out_dir, *pairs = args
        bins = [(p.split("=", 1)[0], Path(p.split("=", 1)[1])) for p in pairs]
        print(wheel(Path(root_dir), bins, Path(licences_txt), Path(out_dir)))
    elif cmd == "check-wheel":
        whl, dist, version, root_dir = args
        check_wheel(Path(whl), Path(dist), version, Path(root_dir))
    elif cmd == "deb-arch":
        print(ARCH[args[0]]["deb"])
    else:
        fail(f"release_tools.py: unknown step {cmd}")


if __name__ == "__main__":
    main(sys.argv[1:])
