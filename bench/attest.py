#!/usr/bin/env python3
"""The attestation side by side, in one run on one machine: quiesce's hashing of one large file
against sha256sum, of many small files against find | xargs sha256sum, verify's re-check against
the first hashing, and PID 1's peak RSS through an attestation of many files. Writes the
"Attestation" section of docs/benchmarks.md. Run through bench/attest (as root)."""

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
Q = os.environ.get("QUIESCE") or os.path.join(ROOT, "target", "x86_64-unknown-linux-musl", "release", "quiesce")
DOC = os.path.join(ROOT, "docs", "benchmarks.md")
BEGIN, END = "<!-- attest: begin (bench/attest) -->", "<!-- attest: end -->"
UID = 4242


def wall(cmd):
    t = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - t


class Init:
    """quiesce as PID 1 of a fresh PID namespace, attesting `tree`."""

    def __init__(self, tree, extra=()):
        self.dir = tempfile.mkdtemp(prefix="quiesce-bench-attest-")
        self.state = os.path.join(self.dir, "state")
        # no_new_privs, as in a container run with no-new-privileges: verify refuses the marker
        # of an init without it (setuid: true) unless given --accept-privilege-escalation.
        self.p = subprocess.Popen(
            ["setpriv", "--no-new-privs",
             "unshare", "--pid", "--fork", "--mount-proc", "--kill-child", Q, "--state-dir", self.state,
             "--sandbox-user", str(UID), "--attest", tree, *extra, "--", "sleep", "1000000"])
        until = time.monotonic() + 10
        while not os.path.exists(os.path.join(self.state, "sandbox.json")):
            if time.monotonic() > until:
                raise SystemExit("bench/attest: the init did not start within 10 s")
            time.sleep(0.01)
        kids = open(f"/proc/{self.p.pid}/task/{self.p.pid}/children").read().split()
        self.pid = int(kids[0])

    def attest(self, budget=1800):
        """A freeze (bare signal), then the attestation's own time from its worker, in s."""
        def status():
            try:
                return json.load(open(os.path.join(self.state, "status.json")))
            except (OSError, ValueError):
                return {}
        last = status().get("id")
        os.kill(self.pid, signal.SIGUSR1)
        until = time.monotonic() + budget
        while time.monotonic() < until:
            st = status()
            a = st.get("attestation") or {}
            if st.get("id") != last and a.get("state") in ("attested", "failed"):
                if a["state"] != "attested":
                    raise SystemExit(f"bench/attest: attestation failed: {a.get('reason')}")
                return int(re.search(r"(\d+) ms", a["reason"]).group(1)) / 1000
            time.sleep(0.01)
        raise SystemExit("bench/attest: no attestation within its budget")

    def verify(self):
        """quiesce verify's wall time inside the namespace (marker checks plus the re-check)."""
        cmd = ["nsenter", "-t", str(self.pid), "-p", "-m", "--", Q, "verify", "--state-dir", self.state,
               "--no-live-probe", "--max-age", "100000"]
        t = time.monotonic()
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        dt = time.monotonic() - t
        if r.returncode != 0:
            raise SystemExit(f"bench/attest: verify failed: {r.stderr.strip()}")
        return dt

    def hwm_kib(self):
        for line in open(f"/proc/{self.pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        return -1

    def close(self):
        self.p.kill()
        self.p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def many_files(top, n, size):
    os.makedirs(top)
    block = os.urandom(size)
    per = 1000
    for d in range((n + per - 1) // per):
        sub = os.path.join(top, f"d{d:04}")
        os.mkdir(sub)
        for i in range(min(per, n - d * per)):
            with open(os.path.join(sub, f"f{i:04}"), "wb") as f:
                f.write(block)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--large-mib", type=int, default=2048)
    ap.add_argument("--small", type=int, default=100_000)
    ap.add_argument("--hwm-files", type=int, default=1_000_000)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="quiesce-bench-trees-", dir="/var/tmp")
    rows = []
    try:
        # One large file of random bytes (in the page cache for every tool: warmed first).
        big = os.path.join(work, "large")
        os.mkdir(big)
        with open(os.path.join(big, "file"), "wb") as f:
            for _ in range(a.large_mib):
                f.write(os.urandom(1 << 20))
        small = os.path.join(work, "small")
        many_files(small, a.small, 1024)
        for tree, name, other, other_cmd in [
            (big, f"one file of {a.large_mib} MiB", "sha256sum", ["sha256sum", os.path.join(big, "file")]),
            (small, f"{a.small:,} files of 1 KiB", "find -type f -print0 | xargs -0 sha256sum",
             ["sh", "-c", f"find {small} -type f -print0 | xargs -0 sha256sum"]),
        ]:
            wall(other_cmd)
            init = Init(tree)
            try:
                ours, theirs, checks = [], [], []
                for _ in range(a.runs):
                    theirs.append(wall(other_cmd))
                    ours.append(init.attest())
                    checks.append(init.verify())
            finally:
                init.close()
            rows.append((name, other, statistics.median(ours), statistics.median(theirs), statistics.median(checks)))
            print(rows[-1], file=sys.stderr)
        shutil.rmtree(small)
        # PID 1's peak RSS through an attestation of many empty files.
        hwm_tree = os.path.join(work, "hwm")
        many_files(hwm_tree, a.hwm_files, 0)
        init = Init(hwm_tree, ["--attest-max-files", str(a.hwm_files + a.hwm_files // 1000 + 10)])
        try:
            before = init.hwm_kib()
            t_hwm = init.attest()
            after = init.hwm_kib()
        finally:
            init.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except StopIteration:
        pass
    ver = subprocess.run(["sha256sum", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    out = [BEGIN, "## Attestation (anchor: coreutils)", "",
           f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} cores ({cpu}), "
           f"kernel {platform.release()}, in one run of `bench/attest --runs {a.runs}`; medians, page cache warm. "
           f"quiesce's time is its worker's own (walk, hash on {min(2, os.cpu_count() or 1)} threads, statement, "
           f"signature, atomic write), read from status.json; the other tool's is its wall time ({ver}).", "",
           "| tree | quiesce attests (s) | other tool | other (s) | throughput ratio (other / quiesce) | verify re-check (s) | re-check / first |",
           "| --- | ---: | --- | ---: | ---: | ---: | ---: |"]
    for name, other, ours, theirs, check in rows:
        out.append(f"| {name} | {ours:.3f} | `{other}` | {theirs:.3f} | {theirs / ours:.2f}× | {check:.3f} | {check / ours:.2f}× |")
    load = os.getloadavg()[0]
    out += ["", f"1-minute load average at the end of the run: {load:.0f} (the ratios are side by side, "
            "each pair run back to back)."]
    out += ["", f"PID 1 through an attestation of {a.hwm_files:,} empty files ({t_hwm:.1f} s): VmHWM "
            f"{before} KiB before the freeze, {after} KiB after (the walk and the hashing run in the worker "
            "process, never in PID 1).", "", "verify's time includes its marker checks and its own start.", END]
    section = "\n".join(out) + "\n"
    text = open(DOC).read() if os.path.exists(DOC) else "# Benchmarks\n"
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + section + text[text.index(END) + len(END) + 1:]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    open(DOC, "w").write(text)
    print(section)


if __name__ == "__main__":
    main()
