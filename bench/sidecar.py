#!/usr/bin/env python3
"""The freeze of 1,000 sandbox processes by quiesce as a sidecar beside a foreign PID 1 (`sleep`),
side by side in one run with the same freeze by quiesce as PID 1. Each run is a fresh PID
namespace (`unshare --pid --fork --mount-proc`); the two alternate run by run, so that both see
the same machine. In both the workload is launched the same way, from outside through `nsenter`
and `quiesce exec --user`, and frozen by `quiesce freeze --wait --json` from outside.

Usage (as root): bench/sidecar.py [--runs N] [--procs N] [--write docs/benchmarks.md]
QUIESCE=PATH names the binary (it needs the sidecar subcommand), ADVERSARY=PATH the adversary.
--write replaces the section between its markers in docs/benchmarks.md (bench.py keeps it).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import bench

UID = 4998
BEGIN, END = "<!-- sidecar: begin (bench/sidecar.py) -->", "<!-- sidecar: end -->"


def launch(ns, q, adv, state_root, n):
    """`n` sleepers under a live parent, as the sandbox user through `quiesce exec`; returns
    once the adversary says the last one was forked (and the fork aftermath has passed)."""
    ready = os.path.join(state_root, "ready")
    cmd = ["env", f"ADV_READY={ready}", q, "exec", "--user", str(UID), "--", adv, "sleepers", str(n)]
    p = subprocess.Popen(["nsenter", "-t", str(ns.init), "-p", "-m", "--"] + cmd,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while not os.path.exists(ready):
        if time.time() > deadline or p.poll() is not None:
            p.kill()
            raise RuntimeError(f"workload not ready: {p.stderr.read().decode(errors='replace')}")
        time.sleep(0.01)
    time.sleep(0.3)  # as bench.py: let reparenting and first runs pass
    return p


def freeze(ns, q, state):
    """One freeze from outside: (quiescent, killed, wall ms, the freezer's own phase total ms)."""
    t = time.perf_counter()
    r = ns.enter([q, "freeze", "--state-dir", state, "--wait", "--json", "--timeout", "60"],
                 capture_output=True, text=True, timeout=120)
    wall = (time.perf_counter() - t) * 1000
    try:
        st = json.loads(r.stdout)
    except ValueError:
        st = {}
    ok = r.returncode == 0 and st.get("state") == "quiescent"
    return ok, int(st.get("killed") or 0), wall, (st.get("phases_ms") or {}).get("total")


def one(mode, q, adv, n):
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as d:
        os.chmod(d, 0o1777)
        state = os.path.join(d, "state")
        if mode == "pid1":
            ns = bench.Ns([q, "--state-dir", state, "--sandbox-user", str(UID), "--", "sleep", "100000"])
            ready = os.path.join(state, "sandbox.json")
            deadline = time.time() + 10
            while not os.path.exists(ready) and time.time() < deadline:
                time.sleep(0.01)
        else:
            ns = bench.Ns(["sleep", "100000"])
            r = ns.enter([q, "sidecar", "--sandbox-user", str(UID), "--state-dir", state],
                         capture_output=True, text=True, timeout=60)
            if r.returncode != 0 or not json.loads(r.stdout or "{}").get("started"):
                ns.close()
                raise RuntimeError(f"the sidecar did not start: {r.stdout}{r.stderr}")
        try:
            p = launch(ns, q, adv, d, n)
            try:
                return freeze(ns, q, state)
            finally:
                p.kill()
                p.wait(timeout=30)
        finally:
            ns.close()


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--runs", type=int, default=7)
    a.add_argument("--procs", type=int, default=1000)
    a.add_argument("--write", help="docs/benchmarks.md: replace the sidecar section")
    a = a.parse_args()
    q = os.environ.get("QUIESCE") or bench.Q
    adv = os.environ.get("ADVERSARY") or bench.ADV
    res = {"pid1": [], "sidecar": []}
    load0 = os.getloadavg()[0]
    for i in range(a.runs):
        for mode in ("pid1", "sidecar"):
            ok, killed, wall, total = one(mode, q, adv, a.procs)
            res[mode].append((ok, killed, wall, total))
            print(f"run {i + 1} {mode:8} quiescent={ok} killed={killed} wall {wall:7.1f} ms "
                  f"in the freezer {total} ms", file=sys.stderr)
    rows = {}
    for mode, rs in res.items():
        good = [r for r in rs if r[0]]
        rows[mode] = {
            "ok": len(good), "runs": len(rs),
            "killed": bench.med([r[1] for r in good]),
            "wall": bench.med([r[2] for r in good]),
            "total": bench.med([r[3] for r in good if r[3] is not None]),
            "range": (min((r[3] for r in good if r[3] is not None), default=float("nan")),
                      max((r[3] for r in good if r[3] is not None), default=float("nan"))),
        }
    p1, sc = rows["pid1"], rows["sidecar"]
    L = [BEGIN, "## The sidecar against the init (anchor: quiesce as PID 1)", "",
         f"Measured {time.strftime('%Y-%m-%d')} in one run of `bench/sidecar.py --runs {a.runs}` (as root), "
         f"the two alternating run by run: {a.procs} sleepers under a live parent, launched as the sandbox "
         "user through `quiesce exec` from outside the namespace, frozen by `quiesce freeze --wait --json` "
         "from outside. PID 1 is quiesce itself, or `sleep` with `quiesce sidecar` beside it. Medians "
         f"(the freezer's range in parentheses). The machine is shared: its 1-minute load average was {load0:.1f} "
         "before the run (the bench's own processes raise it during the run), so compare the two rows with each "
         "other, not with the tables above.", "",
         "| quiesce as | freeze, in the freezer (ms) | × PID 1 | wall from outside (ms) | × PID 1 | killed | quiescent |",
         "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for mode, label in (("pid1", "PID 1 (init)"), ("sidecar", "sidecar beside `sleep`")):
        r = rows[mode]
        L.append(f"| {label} | {r['total']:.1f} ({r['range'][0]:.0f}–{r['range'][1]:.0f}) | "
                 f"{r['total'] / p1['total']:.2f} | {r['wall']:.1f} | "
                 f"{r['wall'] / p1['wall']:.2f} | {r['killed']:.0f} | {r['ok']}/{r['runs']} |")
    L += ["", END]
    text = "\n".join(L)
    print(text)
    print(json.dumps(rows), file=sys.stderr)
    if a.write:
        doc = open(a.write).read()
        if BEGIN in doc and END in doc:
            doc = doc[:doc.index(BEGIN)] + text + doc[doc.index(END) + len(END):]
        else:
            # Before the attestation's section when there is one, else at the end.
            at = doc.find("<!-- attest: begin")
            doc = (doc[:at] + text + "\n\n" + doc[at:]) if at >= 0 else doc.rstrip("\n") + "\n\n" + text + "\n"
        open(a.write, "w").write(doc)
    return 0 if sc["ok"] == a.runs and p1["ok"] == a.runs else 1


if __name__ == "__main__":
    sys.exit(main())
