"""Two builds of quiesce side by side in one run (`bench/run --baseline PATH`): this tree's build
(head) against the quiesce binary at PATH (base). Binary and .text bytes, the init's cost (spawn
overhead, spawn CPU, peak RSS as PID 1 with and without a sandbox user) and the freeze on every
shape of the freeze-by-shape table and every size of the method comparison, the two builds
alternating run by run (and which goes first alternating too) so that machine noise hits both
alike. Reported as head/base ratios of the medians, each with a bootstrap 95% interval; writes its
own section of docs/benchmarks.md, between markers that a normal `bench/run` keeps."""

import os
import random
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import bench

BEGIN, END = "<!-- baseline: begin (bench/run --baseline) -->", "<!-- baseline: end -->"


def elf_sections(path):
    """Section name -> size of an ELF64 little-endian file (readelf's view, without readelf)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        sys.exit(f"bench: {path} is no 64-bit little-endian ELF file: pass a quiesce binary to --baseline")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = heads[shstrndx][4]
    out = {}
    for h in heads:
        name = data[strtab + h[0]:data.index(b"\0", strtab + h[0])].decode()
        out[name] = h[5]
    return out


def commit_of(path):
    """The commit of the worktree a binary was built in, if it is one."""
    d = os.path.dirname(os.path.realpath(path))
    r = subprocess.run(["git", "-C", d, "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "unknown"


def ordered(builds, i):
    """Both builds, the first going first on even runs and second on odd ones."""
    return builds if i % 2 == 0 else builds[::-1]


def ratio_ci(head, base, reps=2000):
    """head/base of the medians and a bootstrap 95% interval of it (each side resampled)."""
    if not head or not base or bench.med(base) == 0:
        return float("nan"), float("nan"), float("nan")
    rng = random.Random(1)
    rs = sorted(bench.med(rng.choices(head, k=len(head))) / bench.med(rng.choices(base, k=len(base)))
                for _ in range(reps))
    return bench.med(head) / bench.med(base), rs[int(0.025 * reps)], rs[int(0.975 * reps) - 1]


def spawn_costs(builds, runs):
    """Wall and CPU time of `INIT -- true` per build, and of bare `true`, interleaved."""
    def one(argv):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run(argv, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - t
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    bare_w, bare_c = [], []
    wall = {n: [] for n, _ in builds}
    cpu = {n: [] for n, _ in builds}
    for i in range(runs):
        w, c = one(["true"])
        bare_w.append(w)
        bare_c.append(c)
        for n, q in ordered(builds, i):
            w, c = one([q, "--", "true"])
            wall[n].append((w - bare_w[-1]) * 1e6)
            cpu[n].append((c - bare_c[-1]) * 1e6)
    return wall, cpu


def rss(builds, reps, sandbox):
    """VmHWM (KiB) of each build as PID 1 after 1 s, with or without a sandbox user, interleaved."""
    out = {n: [] for n, _ in builds}
    for i in range(reps):
        for n, q in ordered(builds, i):
            ns = bench.Ns([q] + (["--sandbox-user", str(bench.UID)] if sandbox else []) + ["--", "sleep", "30"])
            try:
                time.sleep(1)
                out[n].append(bench.status_counter(ns.init, "VmHWM:"))
            finally:
                ns.close()
    return out


def freeze_cases(shapes, sizes):
    """The shapes of the freeze-by-shape table and the sizes of the method comparison, each once."""
    cases = list(shapes)
    for kind, n in sizes:
        case = (kind, bench.BOMB_CAP) if kind == "bomb" else (kind, n)
        if case not in cases:
            cases.append(case)
    return cases


def freezes(builds, runs, cases, loads, until):
    """Each case frozen by each build in a fresh namespace, alternating run by run: per build,
    the phase total, the wall time from outside and each phase, in ms. A run covers every case,
    so a run cut short by `until` (a time.time()) leaves all cases with the same number of runs."""
    res = {c: {b: {"ok": 0, "wall": [], "outside": [], **{p: [] for p in bench.PHASES}} for b, _ in builds}
           for c in cases}
    done = 0
    for i in range(runs):
        if done and time.time() > until:
            print(f"baseline: the time is up after {done} runs of {runs}", file=sys.stderr)
            break
        for kind, n in cases:
            for b, q in ordered(builds, i):
                loads.append(os.getloadavg()[0])
                with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as d:
                    os.chmod(d, 0o1777)
                    state = os.path.join(d, "state")
                    ns = bench.workload_ns(kind, n, state, q)
                    try:
                        ok, wall, phases = bench.m_quiesce_phases(ns, state, q)
                    finally:
                        ns.close()
                g = res[(kind, n)][b]
                g["ok"] += ok
                if ok and "total" in phases:
                    g["wall"].append(wall)
                    # What the phases do not count: the client, the init's notice, its own look
                    # before the stop (where an OOM pass once ran), signing and the answer.
                    g["outside"].append(wall - phases["total"])
                    for p in bench.PHASES:
                        g[p].append(phases.get(p, float("nan")))
        done += 1
        print(f"baseline: run {done} of {runs} done", file=sys.stderr)
    for (kind, n), got in res.items():
        h, s = got["head"], got["base"]
        print(f"  {kind:>9} {n:>5}: head {bench.med(h['total']):7.1f} ms (wall {bench.med(h['wall']):.1f}) "
              f"base {bench.med(s['total']):7.1f} ms (wall {bench.med(s['wall']):.1f}) "
              f"ratio {ratio_ci(h['total'], s['total'])[0]:.3f}  converged {h['ok']}/{done}, {s['ok']}/{done}",
              file=sys.stderr)
    return res, done


def fmt_ratio(head, base):
    r, lo, hi = ratio_ci(head, base)
    return f"{r:.3f} ({lo:.2f}–{hi:.2f})"


def section(head_q, base_q, runs, spawn_runs, rss_reps, cmd, sizes, spawn, rss0, rss1, fr, loads):
    hc, bc = commit_of(head_q), commit_of(base_q)
    hs, bs = elf_sections(head_q), elf_sections(base_q)
    hb, bb = os.path.getsize(head_q), os.path.getsize(base_q)
    wall, cpu = spawn
    L = [BEGIN, "## The build against a baseline (anchor: base)", "",
         f"Measured {time.strftime('%Y-%m-%d')} in one run of `{cmd}` (as root): head is {hc}, base is {bc}, "
         "both built with `cargo build --release --bins --examples` (musl, the same Cargo.toml and lock file). "
         f"The two builds alternate run by run, and which goes first alternates too. The workloads are the same "
         f"adversary binary for both. Ratios are head/base of the medians; in parentheses a bootstrap 95% interval of "
         f"that ratio (each build's runs resampled), so an interval that holds 1 is no difference this run can tell. "
         f"The machine is shared (a fuzzing job at nice 19, other builds and tests): the 1-minute load average "
         f"was {min(loads):.1f}–{max(loads):.1f} across the freezes (median {bench.med(loads):.1f}), so compare the builds "
         "with each other, not with the tables above.", "",
         "| what | head | base | head/base |", "| --- | ---: | ---: | ---: |",
         f"| binary bytes | {hb} | {bb} | {hb / bb:.4f} |",
         f"| .text bytes | {hs.get('.text', 0)} | {bs.get('.text', 0)} | {hs.get('.text', 0) / max(bs.get('.text', 0), 1):.4f} |",
         f"| .rodata bytes | {hs.get('.rodata', 0)} | {bs.get('.rodata', 0)} | {hs.get('.rodata', 0) / max(bs.get('.rodata', 0), 1):.4f} |",
         f"| spawn overhead, wall (µs) | {bench.med(wall['head']):.0f} | {bench.med(wall['base']):.0f} | {fmt_ratio(wall['head'], wall['base'])} |",
         f"| spawn overhead, CPU (µs) | {bench.med(cpu['head']):.0f} | {bench.med(cpu['base']):.0f} | {fmt_ratio(cpu['head'], cpu['base'])} |",
         f"| peak RSS as PID 1 (KiB) | {bench.med(rss0['head']):.0f} | {bench.med(rss0['base']):.0f} | {fmt_ratio(rss0['head'], rss0['base'])} |",
         f"| peak RSS, --sandbox-user (KiB) | {bench.med(rss1['head']):.0f} | {bench.med(rss1['base']):.0f} | {fmt_ratio(rss1['head'], rss1['base'])} |",
         "", f"Spawn overhead: `INIT -- true` minus the bare `true` run just before it, {spawn_runs} runs; "
         f"peak RSS: VmHWM 1 s after start, {rss_reps} starts each.", "",
         "| shape | processes | head freeze ms (in the init) | base | head/base | head wall from outside | base | head/base "
         "| head wall less freeze | base | head/base | stop | walk | kill | probe | converged head, base |",
         "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for (kind, n), g in fr.items():
        h, b = g["head"], g["base"]
        L.append(f"| {kind} | {n} | {bench.med(h['total']):.1f} | {bench.med(b['total']):.1f} | {fmt_ratio(h['total'], b['total'])} | "
                 f"{bench.med(h['wall']):.1f} | {bench.med(b['wall']):.1f} | {fmt_ratio(h['wall'], b['wall'])} | "
                 f"{bench.med(h['outside']):.1f} | {bench.med(b['outside']):.1f} | {fmt_ratio(h['outside'], b['outside'])} | "
                 + " | ".join(f"{bench.med(h[p]) / bench.med(b[p]):.2f}" if bench.med(b[p]) > 0 else "–" for p in bench.PHASES[:-1])
                 + f" | {h['ok']}/{runs}, {b['ok']}/{runs} |")
    L += ["", f"Medians of {runs} runs per build, shape and size (each run covers every shape and size), each in a fresh PID namespace; the freeze's time is its "
          "own phase total, the wall time that of `quiesce freeze --wait --json` from outside (the build's own client), "
          "wall less freeze the wall time less the phase total in each run (the client, the init's notice of it, its "
          "look before the stop, signing, the answer: where the fresh shape's request met an OOM pass before the stop), "
          "and stop / walk / kill / probe the head/base ratios of those phases' medians. The shapes are the freeze-by-shape "
          "table's, the sizes (sleepers) the method comparison's.", END]
    return L


def run(a, shapes, sizes):
    base_q = os.path.realpath(a.baseline)
    if not os.access(base_q, os.X_OK):
        sys.exit(f"bench: --baseline {a.baseline} is no executable: pass the base build's quiesce binary")
    builds = [("head", bench.Q), ("base", base_q)]
    cmd = " ".join(["bench/run"] + sys.argv[1:])
    print("baseline: spawn ...", file=sys.stderr)
    spawn = spawn_costs(builds, a.spawn_runs)
    print("baseline: rss ...", file=sys.stderr)
    rss_reps = 5
    rss0, rss1 = rss(builds, rss_reps, False), rss(builds, rss_reps, True)
    print("baseline: freezes ...", file=sys.stderr)
    loads = []
    until = time.time() + a.minutes * 60 if a.minutes else float("inf")
    fr, done = freezes(builds, a.runs, freeze_cases(shapes, sizes), loads, until)
    L = section(bench.Q, base_q, done, a.spawn_runs, rss_reps, cmd, sizes, spawn, rss0, rss1, fr, loads)
    text = "\n".join(L)
    old = open(a.out).read() if os.path.exists(a.out) else ""
    if BEGIN in old and END in old:
        new = old[:old.index(BEGIN)] + text + old[old.index(END) + len(END):]
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    open(a.out, "w").write(new)
    print(text)
