#!/usr/bin/env python3
"""Check the Kubernetes examples offline, without a cluster: every YAML parses, and each pod
carries the fields the docs rely on. The capabilities come from the caller (tests/kubernetes.rs
reads them from the init's own refusal), so the pods cannot drift from the code.

usage: check.py --caps KILL,SETGID,SETUID [--self-test]
"""
import argparse
import copy
import os
import subprocess
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
QUIESCE = "/usr/local/bin/quiesce"
# pod file -> is shareProcessNamespace on?
PODS = {"pod.yaml": False, "pod-shared-pid.yaml": True}


def env_of(c):
    return {e["name"]: e.get("value") for e in c.get("env", [])}


def under(path, mount):
    """Is `path` strictly inside `mount`?"""
    return path.startswith(mount.rstrip("/") + "/") and len(path) > len(mount.rstrip("/")) + 1


def volume_at(pod, c, path):
    """(mount, volume) of the container's mount that holds `path`."""
    vols = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    for m in c.get("volumeMounts", []):
        if under(path, m["mountPath"]):
            return m, vols.get(m["name"], {})
    return None, {}


def check_pod(pod, shared, caps):
    """Every way the pod differs from what the docs say, as messages."""
    errs = []
    spec = pod.get("spec", {})
    if pod.get("kind") != "Pod" or pod.get("apiVersion") != "v1":
        errs.append("not a v1 Pod")
    if bool(spec.get("shareProcessNamespace", False)) != shared:
        errs.append(f"shareProcessNamespace should be {shared}")
    psc = spec.get("securityContext") or {}
    if "fsGroup" in psc:
        errs.append("pod securityContext sets fsGroup, which makes the Secret's key group-readable")
    inits = [c for c in spec.get("containers", []) if c.get("command") == [QUIESCE]]
    if len(inits) != 1:
        return errs + [f"no single container with command [{QUIESCE}] (quiesce as the entrypoint)"]
    c = inits[0]
    args = c.get("args", [])
    if len(args) < 2 or args[0] != "--":
        errs.append("args should be ['--', COMMAND...]")
    sc = c.get("securityContext") or {}
    if sc.get("runAsUser", psc.get("runAsUser")) != 0:
        errs.append("the init must run as root: runAsUser 0")
    if sc.get("runAsNonRoot", psc.get("runAsNonRoot")):
        errs.append("runAsNonRoot is set: the init must run as root")
    if sc.get("allowPrivilegeEscalation") is not False:
        errs.append("allowPrivilegeEscalation should be false (verify refuses the marker otherwise)")
    capset = sc.get("capabilities") or {}
    if capset.get("drop") != ["ALL"]:
        errs.append("capabilities.drop should be [ALL]")
    if sorted(capset.get("add") or []) != sorted(caps):
        errs.append(f"capabilities.add is {capset.get('add')}, the init needs {sorted(caps)}")
    env = env_of(c)
    if not str(env.get("QUIESCE_SANDBOX_USER", "")).isdigit():
        errs.append("QUIESCE_SANDBOX_USER should be a UID")
    state = env.get("QUIESCE_STATE_DIR") or ""
    m, vol = volume_at(pod, c, state)
    if m is None or "emptyDir" not in vol:
        errs.append("QUIESCE_STATE_DIR should be a directory inside an emptyDir mount")
    else:
        fixed = [
            i for i in spec.get("initContainers", [])
            if i.get("command") == ["chmod", "0755", m["mountPath"]]
            and any(v["name"] == m["name"] for v in i.get("volumeMounts", []))
        ]
        if not fixed:
            errs.append(f"no initContainer runs chmod 0755 {m['mountPath']} on the emptyDir")
    key = env.get("QUIESCE_SIGNING_KEY") or ""
    m, vol = volume_at(pod, c, key)
    if m is None or "secret" not in vol:
        errs.append("QUIESCE_SIGNING_KEY should be inside a Secret mount")
    else:
        if vol["secret"].get("defaultMode") != 0o400:
            errs.append("the Secret's defaultMode should be 0400")
        if not m.get("readOnly"):
            errs.append("the Secret should be mounted readOnly")
    return errs


def check_harness(text, pod):
    c = [c for c in pod["spec"]["containers"] if c.get("command") == [QUIESCE]][0]
    env = env_of(c)
    errs = []
    wants = [
        f"AGENT_USER={env.get('QUIESCE_SANDBOX_USER')} ",
        '"$Q" exec --user "$AGENT_USER"',
        '"$Q" freeze --wait',
        '--nonce "$NONCE"',
    ]
    m, _ = volume_at(pod, c, env.get("QUIESCE_SIGNING_KEY") or "")
    if m is not None:
        wants.append(f"verify --public-key {m['mountPath']}/signing.pub")
    for w in wants:
        if w not in text:
            errs.append(f"harness.sh lacks '{w}'")
    syntax = subprocess.run(["sh", "-n", "-c", text], capture_output=True, text=True)
    if syntax.returncode != 0:
        errs.append(f"harness.sh does not parse: {syntax.stderr.strip()}")
    if "kubectl exec" not in text:
        errs.append("harness.sh does not use kubectl exec")
    return errs


def load():
    docs = {}
    for name in sorted(os.listdir(HERE)):
        if name.endswith((".yaml", ".yml")):
            with open(os.path.join(HERE, name)) as f:
                docs[name] = list(yaml.safe_load_all(f))
    return docs


def self_test(pod, caps):
    """Each check must be able to fail: break the pod one way at a time."""
    def unset(path):
        def f(p):
            *head, last = path
            d = p
            for k in head:
                d = d[k]
            del d[last]
        return f

    def put(path, value):
        def f(p):
            *head, last = path
            d = p
            for k in head:
                d = d[k]
            d[last] = value
        return f

    c0 = ["spec", "containers", 0]
    breaks = {
        "a needed capability missing": put(c0 + ["securityContext", "capabilities", "add"], caps[1:]),
        "an extra capability": put(c0 + ["securityContext", "capabilities", "add"], caps + ["SYS_PTRACE"]),
        "nothing dropped": unset(c0 + ["securityContext", "capabilities", "drop"]),
        "not root": put(c0 + ["securityContext", "runAsUser"], 1000),
        "runAsNonRoot": put(c0 + ["securityContext", "runAsNonRoot"], True),
        "privilege escalation": unset(c0 + ["securityContext", "allowPrivilegeEscalation"]),
        "another entrypoint": put(c0 + ["command"], ["/bin/sh"]),
        "no -- in args": put(c0 + ["args"], ["sleep", "infinity"]),
        "state dir is the emptyDir itself": put(c0 + ["env", 1, "value"], "/var/run/quiesce-vol"),
        "no chmod initContainer": unset(["spec", "initContainers"]),
        "key mode 0440": put(["spec", "volumes", 1, "secret", "defaultMode"], 0o440),
        "key not read-only": unset(c0 + ["volumeMounts", 1, "readOnly"]),
        "fsGroup": put(["spec", "securityContext", "fsGroup"], 1000),
        "shared pid flipped": put(["spec", "shareProcessNamespace"], True),
        "not a Pod": put(["kind"], "Deployment"),
    }
    failed = []
    for what, brk in breaks.items():
        p = copy.deepcopy(pod)
        brk(p)
        if not check_pod(p, False, caps):
            failed.append(what)
    with open(os.path.join(HERE, "harness.sh")) as f:
        text = f.read()
    if not check_harness(text.replace("freeze --wait", "freeze"), pod):
        failed.append("harness without freeze --wait")
    if not check_harness(text + "\nif then\n", pod):
        failed.append("harness that does not parse")
    return failed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--caps", required=True, help="the capabilities the init needs, comma-separated")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    caps = sorted(x for x in a.caps.split(",") if x)
    docs = load()
    errs = []
    for name, shared in PODS.items():
        if name not in docs or len(docs[name]) != 1:
            errs.append(f"{name}: missing, or not one document")
            continue
        errs += [f"{name}: {e}" for e in check_pod(docs[name][0], shared, caps)]
    if "pod.yaml" in docs:
        with open(os.path.join(HERE, "harness.sh")) as f:
            errs += check_harness(f.read(), docs["pod.yaml"][0])
        if a.self_test:
            errs += [f"self-test: the check missed: {w}" for w in self_test(docs["pod.yaml"][0], caps)]
    for e in errs:
        print(f"check.py: {e}", file=sys.stderr)
    print(f"check.py: {len(docs)} YAML files parsed, {len(errs)} problem(s)")
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main())
