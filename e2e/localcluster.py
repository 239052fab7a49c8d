#!/usr/bin/env python3
"""A real, local Kubernetes control plane for tests: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok, built from source through
the Go module proxy.

    e2e/localcluster build                 # build (once) and cache the binaries
    e2e/localcluster up --workdir DIR      # start everything, write DIR/kubeconfig
    e2e/localcluster down --workdir DIR    # stop what `up` started, remove DIR
    e2e/localcluster kwok --kubeconfig K   # kwok alone, for another cluster (e2e/kind)

Binaries are cached per version under ``$BATCHSCHED_CACHE`` (default
``~/.cache/batchsched``); nothing is downloaded prebuilt and nothing lands in
the repository. Versions are pinned in ``e2e/versions.env``.

Only the standard library is used, so this runs before the project's own
dependencies are installed.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
VERSIONS_FILE = HERE / "versions.env"

# kwok manages only nodes carrying this label, so it never touches real nodes.
KWOK_NODE_LABEL = "batchsched.io/simulated"
NATIVE_GANG_GATE = "GenericWorkload"
KWOK_NODE_LABEL_VALUE = "true"
ADMIN_USER = "batchsched-admin"
# The API server's audit log records what ServiceAccounts do (nothing else, so
# it stays small): tests/integration/test_deploy.py checks every RBAC rule of
# deploy/ against the requests the scheduler really made.
AUDIT_LOG = "audit.log"
AUDIT_POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
                "rules": [{"level": "Metadata", "userGroups": ["system:serviceaccounts"]}, {"level": "None"}]}


def log(msg: str) -> None:
    print(f"[localcluster] {msg}", file=sys.stderr, flush=True)


def read_versions() -> dict[str, str]:
    versions = {}
    for line in VERSIONS_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            versions[key.strip()] = value.strip()
    return versions


def cache_root() -> Path:
    return Path(os.environ.get("BATCHSCHED_CACHE", Path.home() / ".cache" / "batchsched"))


# --------------------------------------------------------------------------
# Building from the Go module proxy
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class GoBuild:
    """One Go module version and the commands to build out of it."""

    module: str
    version: str
    packages: dict[str, str]  # binary name -> package path
    ldflags: str = "-s -w"

    @property
    def key(self) -> str:
        return f"{self.module.replace('/', '_')}@{self.version}"


def _parse_gomod_requirements_and_local_replaces(gomod: str) -> tuple[dict[str, str], set[str]]:
    """Return (required module -> version, modules replaced by a local path)."""
    requires: dict[str, str] = {}
    local_replaces: set[str] = set()
    block = None
    for raw in gomod.splitlines():
        line = raw.split("//", 1)[0].strip()
        if not line:
            continue
        if line.endswith("(") and line.split()[0] in ("require", "replace"):
            block = line.split()[0]
            continue
        if line == ")":
            block = None
            continue
        kind, rest = block, line
        if block is None:
            kind, _, rest = line.partition(" ")
        parts = rest.split()
        if kind == "require" and len(parts) >= 2:
            requires[parts[0]] = parts[1]
        elif kind == "replace" and "=>" in parts:
            arrow = parts.index("=>")
            target = parts[arrow + 1]
            if target.startswith("./") or target.startswith("../"):
                local_replaces.add(parts[0])
    return requires, local_replaces


def wrapper_gomod(build: GoBuild, target_gomod: str) -> str:
    """A go.mod that requires the target and pins what it replaces locally.

    A module whose go.mod replaces dependencies with local directories (the
    staging modules of k8s.io/kubernetes) cannot be built as a dependency:
    those replaces are ignored and the requirements say ``v0.0.0``.  The
    published versions are substituted here, derived from the target's own
    go.mod, never from a hand-written list.
    """
    requires, local = _parse_gomod_requirements_and_local_replaces(target_gomod)
    go_directive = re.search(r"^go\s+(\S+)", target_gomod, re.M)
    replaces = []
    for mod in sorted(local):
        # Only unpublished placeholders need a version; a local replace of a
        # module the target does not require (etcd's own tests) is irrelevant.
        if requires.get(mod) == "v0.0.0":
            # kubernetes vX.Y.Z publishes its staging modules as v0.Y.Z
            major_minor_patch = build.version.lstrip("v").split(".")
            staging = "v0." + ".".join(major_minor_patch[1:])
            replaces.append(f"\t{mod} => {mod} {staging}")
    lines = [
        "module batchsched.local/build",
        "",
        f"go {go_directive.group(1) if go_directive else '1.22'}",
        "",
        f"require {build.module} {build.version}",
    ]
    if replaces:
        lines += ["", "replace (", *replaces, ")"]
    return "\n".join(lines) + "\n"


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GOTOOLCHAIN", "auto")
    env["CGO_ENABLED"] = "0"
    env["GOFLAGS"] = "-mod=mod -buildvcs=false"
    return env


def build_binaries(build: GoBuild) -> Path:
    out = cache_root() / "bin" / build.key
    if all((out / name).is_file() for name in build.packages):
        return out
    src = cache_root() / "src" / build.key
    src.mkdir(parents=True, exist_ok=True)
    env = go_env()
    t0 = time.monotonic()
    log(f"resolving {build.module}@{build.version}")
    info = json.loads(
        subprocess.run(
            ["go", "mod", "download", "-json", f"{build.module}@{build.version}"],
            # outside any module, so a stale wrapper go.mod cannot interfere
            cwd=src.parent, env=env, check=True, capture_output=True, text=True,
        ).stdout
    )
    (src / "go.mod").write_text(wrapper_gomod(build, Path(info["GoMod"]).read_text()))
    (src / "go.sum").touch()
    out.mkdir(parents=True, exist_ok=True)
    for name, pkg in build.packages.items():
        if (out / name).is_file():  # a component added later builds alone
            continue
        log(f"building {name} from {pkg}@{build.version}")
        tmp = out / f".{name}.tmp"
        subprocess.run(
            ["go", "build", "-trimpath", "-ldflags", build.ldflags, "-o", str(tmp), pkg],
            cwd=src, env=env, check=True,
        )
        tmp.rename(out / name)
    log(f"built {build.module}@{build.version} in {time.monotonic() - t0:.0f}s -> {out}")
    return out


def component_builds() -> dict[str, GoBuild]:
    v = read_versions()
    kver = v["KUBERNETES_VERSION"]
    major, minor = kver.lstrip("v").split(".")[:2]
    stamp = " ".join(
        f"-X k8s.io/component-base/version.{k}={val}"
        for k, val in (("gitVersion", kver), ("gitMajor", major), ("gitMinor", minor),
                       ("gitTreeState", "clean"))
    )
    return {
        "kubernetes": GoBuild(
            "k8s.io/kubernetes", kver,
            {"kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
             "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
             "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
             "kubectl": "k8s.io/kubernetes/cmd/kubectl"},
            ldflags=f"-s -w {stamp}",
        ),
        "etcd": GoBuild("go.etcd.io/etcd/server/v3", v["ETCD_VERSION"],
                        {"etcd": "go.etcd.io/etcd/server/v3"}),
        "kwok": GoBuild("sigs.k8s.io/kwok", v["KWOK_VERSION"],
                        {"kwok": "sigs.k8s.io/kwok/cmd/kwok"}),
        "kueue": GoBuild("sigs.k8s.io/kueue", v["KUEUE_VERSION"], {"kueue": "sigs.k8s.io/kueue/cmd/kueue"}),
        "jobset": GoBuild("sigs.k8s.io/jobset", v["JOBSET_VERSION"], {"jobset": "sigs.k8s.io/jobset"}),
        "helm": GoBuild("helm.sh/helm/v3", v["HELM_VERSION"], {"helm": "helm.sh/helm/v3/cmd/helm"},
                        ldflags=f"-s -w -X helm.sh/helm/v3/internal/version.version={v['HELM_VERSION']}"),
    }


def build_all() -> dict[str, Path]:
    """Build every binary (or reuse the cache); return binary name -> path."""
    paths = {}
    for build in component_builds().values():
        out = build_binaries(build)
        for name in build.packages:
            paths[name] = out / name
    return paths



# --------------------------------------------------------------------------
# Running the control plane
# --------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """preexec_fn: the child is killed when the process that started it dies,
    so a crashed test run leaves no control plane behind."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    workdir: Path
    server: str
    token: str
    pids: dict[str, int]
    # how each process was started, so restart() can start it again the same way
    argv: dict[str, list[str]] = field(default_factory=dict)
    die_with_parent: bool = False

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def audit_log(self) -> Path:
        return self.workdir / AUDIT_LOG


def _kubeconfig(server: str, token: str) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": ADMIN_USER, "user": {"token": token}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": ADMIN_USER}}],
        "current-context": "local",
    }, indent=2)


def _request(server: str, token: str, method: str, path: str, body: dict | None = None,
             timeout: float = 5.0) -> tuple[int, bytes]:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(server + path, data=data, method=method, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _wait(what: str, check, timeout: float, procs: dict[str, subprocess.Popen]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, proc in procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode} while waiting for {what}")
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def kwok_argv(kwok: Path, kubeconfig: Path) -> list[str]:
    """kwok simulating the nodes labelled KWOK_NODE_LABEL of the cluster ``kubeconfig`` names."""
    return [
        str(kwok), f"--kubeconfig={kubeconfig}",
        f"--config={HERE / 'kwok-stages.yaml'}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-label-selector={KWOK_NODE_LABEL}={KWOK_NODE_LABEL_VALUE}",
        f"--server-address=127.0.0.1:{free_port()}",
        "--node-ip=10.244.0.1", "--cidr=10.244.0.0/16",
    ]


def controller_manager_argv(binary: Path, kubeconfig: Path, pki: Path) -> list[str]:
    """kube-controller-manager for the local control plane, with the admin's
    credentials (a test cluster: no per-controller ServiceAccounts)."""
    return [
        str(binary), f"--kubeconfig={kubeconfig}",
        # the key the API server verifies ServiceAccount tokens with, and the
        # certificate it generated for itself, published as kube-root-ca.crt
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'apiserver.crt'}",
        # Node health is kwok's and the tests': were kwok stopped (or starved)
        # for longer than the node monitor's grace period, the node lifecycle
        # controller would taint every node unreachable and the taint eviction
        # controller evict its pods. node-ipam needs a --cluster-cidr the
        # simulated nodes do not use.
        "--controllers=*,-node-lifecycle-controller,-taint-eviction-controller,-node-ipam-controller,"
        # publishes the serving certificate as a CA bundle: the API server's
        # self-signed one is no CA and is refused
        "-kube-apiserver-serving-clustertrustbundle-publisher-controller",
        "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
        # tests create hundreds of pods through Jobs in seconds
        "--kube-api-qps=1000", "--kube-api-burst=2000",
        f"--feature-gates={NATIVE_GANG_GATE}=true",  # its podgroup-protection controller
        "--profiling=false", "-v=1",
    ]


def up(workdir: Path, with_scheduler: bool = True, with_controller_manager: bool = True,
       die_with_parent: bool = False) -> Cluster:
    """Start etcd, kube-apiserver, kwok and (optionally) kube-scheduler and
    kube-controller-manager."""
    t0 = time.monotonic()
    bins = build_all()
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    logs = workdir / "logs"
    logs.mkdir(exist_ok=True)
    procs: dict[str, subprocess.Popen] = {}
    argvs: dict[str, list[str]] = {}

    def start(name: str, argv: list[str]) -> None:
        argvs[name] = argv
        procs[name] = _start_process(logs / f"{name}.log", argv, die_with_parent)
        _write_pids(workdir, {n: p.pid for n, p in procs.items()})

    try:
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        start("etcd", [
            str(bins["etcd"]), "--name=e2e", f"--data-dir={workdir / 'etcd'}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=e2e={peer_url}", "--unsafe-no-fsync", "--log-level=warn",
            "--quota-backend-bytes=8589934592",
        ])

        pki = workdir / "pki"
        pki.mkdir(exist_ok=True)
        sa_key = pki / "sa.key"
        subprocess.run(["openssl", "genrsa", "-out", str(sa_key), "2048"], check=True,
                       capture_output=True)
        token = secrets.token_hex(24)
        (pki / "tokens.csv").write_text(f'{token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
        server = f"https://127.0.0.1:{api_port}"
        (workdir / "audit-policy.json").write_text(json.dumps(AUDIT_POLICY))
        _wait("etcd", lambda: urllib.request.urlopen(etcd_url + "/health", timeout=1).status == 200,
              30, procs)
        start("kube-apiserver", [
            str(bins["kube-apiserver"]), f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={api_port}",
            f"--cert-dir={pki}", f"--token-auth-file={pki / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            f"--service-account-key-file={sa_key}", f"--service-account-signing-key-file={sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range=10.96.0.0/16",
            # TaintNodesByCondition taints every new node not-ready, and only the
            # node lifecycle controller (not run, see controller_manager_argv)
            # lifts that taint. The ServiceAccount plugin refuses a pod until its
            # namespace's default ServiceAccount exists: it waits briefly for the
            # controller manager to create it, without one it refuses them all.
            "--disable-admission-plugins=" + ",".join(
                ["TaintNodesByCondition"] + ([] if with_controller_manager else ["ServiceAccount"])),
            "--allow-privileged=true", "--endpoint-reconciler-type=none",
            "--max-requests-inflight=2000", "--max-mutating-requests-inflight=1000",
            f"--audit-policy-file={workdir / 'audit-policy.json'}", f"--audit-log-path={workdir / AUDIT_LOG}",
            "--audit-log-format=json",
            # the native gang API (scheduling.k8s.io/v1beta1 PodGroups, pods' spec.schedulingGroup):
            # beta and off by default in v1.37, read by batchsched where served (docs/integrations.md)
            f"--feature-gates={NATIVE_GANG_GATE}=true", "--runtime-config=scheduling.k8s.io/v1beta1=true",
            "--profiling=false", "-v=1",
        ])
        _wait("kube-apiserver /readyz",
              lambda: _request(server, token, "GET", "/readyz", timeout=2)[0] == 200, 60, procs)
        cluster = Cluster(workdir, server, token, {})
        cluster.kubeconfig.write_text(_kubeconfig(server, token))
        # kwok keeps node heartbeats as Leases there; no controller creates it.
        _request(server, token, "POST", "/api/v1/namespaces",
                 {"metadata": {"name": "kube-node-lease"}})
        start("kwok", kwok_argv(bins["kwok"], cluster.kubeconfig))
        if with_scheduler:
            sched_config = workdir / "kube-scheduler.yaml"
            sched_config.write_text(json.dumps({
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "clientConnection": {"kubeconfig": str(cluster.kubeconfig), "qps": 5000, "burst": 5000},
                "leaderElection": {"leaderElect": False},
            }))
            start("kube-scheduler", [
                str(bins["kube-scheduler"]), f"--config={sched_config}",
                f"--authentication-kubeconfig={cluster.kubeconfig}",
                f"--authorization-kubeconfig={cluster.kubeconfig}",
                "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "-v=1",
            ])
        if with_controller_manager:
            # Not waited for: its controllers act once its informers have
            # synced (about a second), and tests wait for what controllers do.
            start("kube-controller-manager", controller_manager_argv(
                bins["kube-controller-manager"], cluster.kubeconfig, pki))
        time.sleep(0.2)
        for name, proc in procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}; see {logs / (name + '.log')}")
        cluster.pids = {n: p.pid for n, p in procs.items()}
        cluster.argv, cluster.die_with_parent = argvs, die_with_parent
        (workdir / "cluster.json").write_text(json.dumps(
            {"server": server, "token": token, "pids": cluster.pids}, indent=2))
        log(f"up in {time.monotonic() - t0:.1f}s: {server} (kubeconfig {cluster.kubeconfig})")
        return cluster
    except BaseException:
        _stop_pids({n: p.pid for n, p in procs.items()})
        raise


def _start_process(log_path: Path, argv: list[str], die_with_parent: bool) -> subprocess.Popen:
    return subprocess.Popen(
        argv, stdout=open(log_path, "ab"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        preexec_fn=_die_with_parent if die_with_parent else None,
        start_new_session=not die_with_parent,
    )


def kill_component(cluster: Cluster, name: str) -> None:
    """SIGKILL one process of the cluster (a crash: no graceful shutdown) and reap it."""
    pid = cluster.pids[name]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _pid_alive(pid) and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.02)


def start_component(cluster: Cluster, name: str, timeout: float = 60.0) -> None:
    """Start one killed process again with its first command line: the same
    port and the same etcd, so every kubeconfig stays valid. Returns once
    kube-apiserver answers /readyz (other components: once started)."""
    proc = _start_process(cluster.workdir / "logs" / f"{name}.log", cluster.argv[name], cluster.die_with_parent)
    cluster.pids[name] = proc.pid
    _write_pids(cluster.workdir, cluster.pids)
    if name == "kube-apiserver":
        _wait("kube-apiserver /readyz after a restart",
              lambda: _request(cluster.server, cluster.token, "GET", "/readyz", timeout=2)[0] == 200,
              timeout, {name: proc})


def restart_component(cluster: Cluster, name: str, down_seconds: float = 0.0, timeout: float = 60.0) -> None:
    """SIGKILL, stay down ``down_seconds``, start again (see start_component)."""
    kill_component(cluster, name)
    time.sleep(down_seconds)
    start_component(cluster, name, timeout)


def _write_pids(workdir: Path, pids: dict[str, int]) -> None:
    (workdir / "pids.json").write_text(json.dumps(pids))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _stop_pids(pids: dict[str, int], timeout: float = 10.0) -> None:
    # Reverse start order: clients first, etcd last.
    for name, pid in reversed(list(pids.items())):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError:
            continue
        if not cmdline.endswith(name):
            continue  # the pid was reused by something that is not ours
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _pid_alive(pid) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.05)
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
        _reap(pid)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def down(workdir: Path) -> None:
    workdir = workdir.resolve()
    pids_file = workdir / "pids.json"
    if pids_file.exists():
        _stop_pids(json.loads(pids_file.read_text()))
    shutil.rmtree(workdir, ignore_errors=True)
    log(f"down: {workdir} removed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="e2e/localcluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build (or reuse) the control-plane binaries")
    p_up = sub.add_parser("up", help="start the control plane")
    p_up.add_argument("--workdir", type=Path, required=True)
    p_up.add_argument("--no-scheduler", action="store_true", help="do not start kube-scheduler")
    p_up.add_argument("--no-controller-manager", action="store_true",
                      help="do not start kube-controller-manager")
    p_down = sub.add_parser("down", help="stop it and remove the workdir")
    p_down.add_argument("--workdir", type=Path, required=True)
    p_kwok = sub.add_parser("kwok", help="run kwok (foreground) for the simulated nodes of another cluster")
    p_kwok.add_argument("--kubeconfig", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "build":
        for name, path in build_all().items():
            print(f"{name}\t{path}")
    elif args.command == "kwok":
        argv = kwok_argv(build_all()["kwok"], args.kubeconfig.resolve())
        os.execv(argv[0], argv)
    elif args.command == "up":
        cluster = up(args.workdir, with_scheduler=not args.no_scheduler,
                     with_controller_manager=not args.no_controller_manager)
        print(f"export KUBECONFIG={cluster.kubeconfig}")
    else:
        down(args.workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
