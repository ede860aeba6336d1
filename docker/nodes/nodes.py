"""Node containers that stand in for GPU machines: Debian bookworm with its own dockerd, on a
user-defined bridge network, reached by Ansible through the Docker CLI (no SSH).

    python docker/nodes/nodes.py up --prefix ddp --nodes 2      # ddp-node0, ddp-node1 on ddp-net
    python docker/nodes/nodes.py down --prefix ddp
    python docker/nodes/nodes.py inventory --prefix ddp > inv.yml

They run unprivileged (no --privileged): every capability but SYS_RESOURCE, no seccomp or
AppArmor profile, the host's cgroup tree, and a volume for the inner engine's /var/lib/docker.
"""

import argparse
import contextlib
import subprocess
import sys
from pathlib import Path

import docker
import yaml

from app.orchestrate import engine

REPO = Path(__file__).resolve().parents[2]
NODE_IMAGE = "ddp-cluster-node:bookworm"
BUILD_SCRIPT = REPO / "docker" / "nodes" / "build.sh"
LOCAL_INVENTORY = REPO / "ansible" / "inventory" / "local-nodes.yml"
NODE_HOST_CONFIG = {
    "cap_add": ["ALL"], "cap_drop": ["SYS_RESOURCE"],
    "security_opt": ["seccomp=unconfined", "apparmor=unconfined"],
}  # fmt: skip
"""The node containers' HostConfig in the SDK's words: ``docker run --cap-add ALL --cap-drop SYS_RESOURCE
--security-opt seccomp=unconfined --security-opt apparmor=unconfined``."""
CGROUP_BIND = "/sys/fs/cgroup:/sys/fs/cgroup:rw"
"""The host's cgroup tree, which the node's own dockerd manages its containers in."""
SYSTEM_PATHS_UNCONFINED = {"MaskedPaths": [], "ReadonlyPaths": []}
"""``--security-opt systempaths=unconfined`` as the CLI sends it to the Engine API (which refuses the option's own
words): nothing of /proc or /sys masked or read-only. The SDK's ``containers.run`` does not take these fields."""


def names(prefix: str, count: int) -> list[str]:
    """Container names of the nodes: PREFIX-node0 ..."""
    return [f"{prefix}-node{i}" for i in range(count)]


def exec_in(name: str, *command: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run a command in a node container (as ``docker exec NAME COMMAND``): its exit status and output as text;
    with ``check``, a command that fails raises with its standard error."""
    code, (out, err) = engine.client().containers.get(name).exec_run(list(command), demux=True)
    done = subprocess.CompletedProcess(list(command), code, (out or b"").decode(), (err or b"").decode())
    if check and code != 0:
        raise RuntimeError(f"{' '.join(command)} in {name} exited with {code}: {done.stderr.strip()[-2000:]}")
    return done


def ensure_node_image() -> None:
    """Build the node image with debootstrap when the engine lacks it (about a minute)."""
    if not engine.has_image(NODE_IMAGE):
        subprocess.run([str(BUILD_SCRIPT), NODE_IMAGE], check=True, timeout=1200)


def up(prefix: str, count: int) -> list[str]:
    """Start COUNT node containers on the network PREFIX-net; returns their names."""
    ensure_node_image()
    down(prefix)
    api = engine.client().api
    labels = {"ddp-cluster.nodes": prefix}
    api.create_network(f"{prefix}-net", labels=labels)
    for index, name in enumerate(names(prefix, count)):
        binds = [CGROUP_BIND, f"{name}-docker:/var/lib/docker"]  # and the inner engine's images, on a volume
        host = api.create_host_config(**NODE_HOST_CONFIG, binds=binds, network_mode=f"{prefix}-net")
        host.update(SYSTEM_PATHS_UNCONFINED)
        api.create_container(NODE_IMAGE, name=name, hostname=f"node{index}", labels=labels, host_config=host)
        api.start(name)
    return names(prefix, count)


def leftovers(prefix: str) -> list[str]:
    """Containers, volumes and networks of PREFIX that still exist."""
    client, label = engine.client(), {"label": f"ddp-cluster.nodes={prefix}"}
    found = [c.name for c in client.containers.list(all=True, filters=label)]
    found += [n.name for n in client.networks.list(filters=label)]
    return found + [v.name for v in client.volumes.list() if v.name.startswith(f"{prefix}-node")]


def down(prefix: str) -> None:
    """Remove the node containers, their volumes and the network of PREFIX (one gone already is fine:
    leftovers() tells what is left)."""
    client, label = engine.client(), {"label": f"ddp-cluster.nodes={prefix}"}
    for container in client.containers.list(all=True, filters=label):
        with contextlib.suppress(docker.errors.APIError):
            container.remove(force=True, v=True)
    for volume in client.volumes.list():
        if volume.name.startswith(f"{prefix}-node"):
            with contextlib.suppress(docker.errors.APIError):
                volume.remove(force=True)
    for network in client.networks.list(filters=label):
        with contextlib.suppress(docker.errors.APIError):
            network.remove()


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
