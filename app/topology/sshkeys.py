"""The one SSH key scheme of mpirun over SSH: per cluster, a user key and a host key, made once
where the cluster is started (the compose cluster's init container, Ansible's controller) and
kept there, never in an image or a commit. Every node gets the same folder, so ``authorized_keys``
admits the cluster's user everywhere and one ``known_hosts`` line (``* <host key>``) verifies
every node.

    python -m app topology --name mycluster --format ssh-keys --output-dir ~/.cache/ddp-cluster/ssh/mycluster
"""

import subprocess
from pathlib import Path

from app.errors import UsageError

USER_KEY = "id_ed25519"
HOST_KEY = "ssh_host_ed25519_key"
FILES = (USER_KEY, f"{USER_KEY}.pub", HOST_KEY, f"{HOST_KEY}.pub", "authorized_keys", "known_hosts")
"""What a key folder holds: the files sshd_config and ssh_config of the image point at."""


def _keygen(path: Path, comment: str) -> None:
    try:
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except FileNotFoundError:
        raise UsageError("ssh-keygen not found: install OpenSSH's client (Debian: openssh-client)") from None
    except subprocess.CalledProcessError as error:
        raise UsageError(f"ssh-keygen could not write {path}: {error.stderr.strip()}") from None


def make_keys(folder: Path, cluster: str) -> list[str]:
    """Create the cluster's keys in ``folder`` (mode 0700) unless they exist; the names it wrote."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    folder.chmod(0o700)
    made = []
    for key, role in ((USER_KEY, "app"), (HOST_KEY, "host")):
        if not (folder / key).is_file():
            (folder / f"{key}.pub").unlink(missing_ok=True)
            _keygen(folder / key, f"{role}@{cluster}")
            made += [key, f"{key}.pub"]
    user_public = (folder / f"{USER_KEY}.pub").read_text().strip()
    host_public = " ".join((folder / f"{HOST_KEY}.pub").read_text().split()[:2])
    for name, text in (("authorized_keys", user_public), ("known_hosts", f"* {host_public}")):
        path = folder / name
        if not path.is_file() or path.read_text().strip() != text:
            path.write_text(text + "\n")
            path.chmod(0o600)
            made.append(name)
    return made
