"""Node containers that stand in for GPU machines: Debian bookworm with its own dockerd, on a
user-defined bridge network, reached by Ansible through the Docker CLI (no SSH).

    python tests/rigs/nodes/nodes.py up --prefix ddp --nodes 2      # ddp-node0, ddp-node1 on ddp-net
    python tests/rigs/nodes/nodes.py down --prefix ddp
    python tests/rigs/nodes/nodes.py inventory --prefix ddp > inv.yml

They run unprivileged (no --privileged): every capability but SYS_RESOURCE, no seccomp or
AppArmor profile, the host's cgroup tree, and a volume for the inner engine's /var/lib/docker.
"""

import argparse
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
NODE_IMAGE = "ddp-cluster-node:bookworm"
BUILD_SCRIPT = REPO / "tests" / "rigs" / "nodes" / "build.sh"
LOCAL_INVENTORY = REPO / "ansible" / "inventory" / "local-nodes.yml"
DOCKER_TIMEOUT_S = 120
NODE_RUN_ARGS = [
    "--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE",
    "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
    "--security-opt", "systempaths=unconfined",
    "--volume", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
]  # fmt: skip


def docker(*args: str, check: bool = True, timeout: float = DOCKER_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run the docker CLI and return its result (stdout/stderr as text)."""
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, timeout=timeout)


def names(prefix: str, count: int) -> list[str]:
    """Container names of the nodes: PREFIX-node0 ..."""
    return [f"{prefix}-node{i}" for i in range(count)]


def ensure_node_image() -> None:
    """Build the node image with debootstrap when the engine lacks it (about a minute)."""
    if docker("image", "inspect", NODE_IMAGE, check=False).returncode != 0:
        subprocess.run([str(BUILD_SCRIPT), NODE_IMAGE], check=True, timeout=1200)


def up(prefix: str, count: int) -> list[str]:
    """Start COUNT node containers on the network PREFIX-net; returns their names."""
    ensure_node_image()
    down(prefix)
    docker("network", "create", "--label", f"ddp-cluster.nodes={prefix}", f"{prefix}-net")
    for index, name in enumerate(names(prefix, count)):
        docker("run", "--detach", "--name", name, "--hostname", f"node{index}", "--network", f"{prefix}-net",
               "--label", f"ddp-cluster.nodes={prefix}", *NODE_RUN_ARGS,
               "--volume", f"{name}-docker:/var/lib/docker", NODE_IMAGE)  # fmt: skip
    return names(prefix, count)


def leftovers(prefix: str) -> list[str]:
    """Containers, volumes and networks of PREFIX that still exist."""
    label = f"label=ddp-cluster.nodes={prefix}"
    found = docker("ps", "-aq", "--filter", label).stdout.split()
    found += docker("network", "ls", "-q", "--filter", label).stdout.split()
    found += [v for v in docker("volume", "ls", "-q").stdout.split() if v.startswith(f"{prefix}-node")]
    return found


def down(prefix: str) -> None:
    """Remove the node containers, their volumes and the network of PREFIX."""
    label = f"label=ddp-cluster.nodes={prefix}"
    containers = docker("ps", "-aq", "--filter", label).stdout.split()
    if containers:
        docker("rm", "--force", "--volumes", *containers, check=False)
    volumes = [v for v in docker("volume", "ls", "-q").stdout.split() if v.startswith(f"{prefix}-node")]
    if volumes:
        docker("volume", "rm", "--force", *volumes, check=False)
    networks = docker("network", "ls", "-q", "--filter", label).stdout.split()
    if networks:
        docker("network", "rm", *networks, check=False)  # gone already is fine: leftovers() tells


def inventory(prefix: str, count: int) -> dict:
    """ansible/inventory/local-nodes.yml with the hosts renamed to this prefix's containers."""
    data = yaml.safe_load(LOCAL_INVENTORY.read_text())
    group = data["all"]["children"]["ddp_cluster"]
    group["hosts"] = {name: None for name in names(prefix, count)}
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["up", "down", "inventory"])
    parser.add_argument("--prefix", default="ddp", help="name prefix (default ddp: ddp-node0, ddp-net)")
    parser.add_argument("--nodes", type=int, default=2, help="number of nodes (default 2)")
    args = parser.parse_args(argv)
    if args.action == "up":
        print("\n".join(up(args.prefix, args.nodes)))
    elif args.action == "down":
        down(args.prefix)
    else:
        sys.stdout.write(yaml.safe_dump(inventory(args.prefix, args.nodes), sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
