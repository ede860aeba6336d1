"""The GPU roles without a GPU: package and repository selection for Ubuntu 22.04/24.04 and
Debian 12, GPU and NVSwitch detection from a fake PCI tree, the skip path on a host without a
GPU, and the rendered templates. Runs ansible-playbook on localhost; changes nothing.

    .venv/bin/python -m pytest tests/ansible/test_nvidia_roles.py -m ansible
"""

import json
from pathlib import Path

import pytest

from tests.ansible.conftest import run_playbook

pytestmark = pytest.mark.ansible
PLAYBOOKS = Path(__file__).resolve().parent / "playbooks"
LOCALHOST = "localhost,"


def fake_pci(root: Path, devices: dict[str, tuple[str, str]]) -> Path:
    """A /sys/bus/pci/devices stand-in: one folder per address with vendor and class files."""
    for address, (vendor, pci_class) in devices.items():
        (root / address).mkdir(parents=True)
        (root / address / "vendor").write_text(vendor + "\n")
        (root / address / "class").write_text(pci_class + "\n")
    return root


def os_facts(distribution: str, major: str, release: str, arch: str = "x86_64") -> dict:
    return {"ansible_distribution": distribution, "ansible_distribution_major_version": major,
            "ansible_distribution_release": release, "ansible_architecture": arch,
            "ansible_kernel": "6.8.0-45-generic"}  # fmt: skip


def plan(tmp_path: Path, facts: dict, **role_vars) -> tuple[object, dict]:
    pci = fake_pci(tmp_path / "pci", {"0000:00:02.0": ("0x8086", "0x030000")})
    extravars = {**facts, **role_vars, "plan_out": str(tmp_path), "gpu_facts_pci_root": str(pci)}
    run = run_playbook(PLAYBOOKS / "nvidia-plan.yml", LOCALHOST, extravars, timeout=300)
    result = json.loads((tmp_path / "plan.json").read_text()) if run.status == "successful" else {}
    return run, result


CASES = {
    "ubuntu22-cuda-open": (os_facts("Ubuntu", "22", "jammy"), {},
                           "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64",
                           ["nvidia-open-570"], ["nvidia-fabricmanager-570"]),
    "ubuntu24-cuda-proprietary": (os_facts("Ubuntu", "24", "noble"),
                                  {"nvidia_driver_open_kernel_modules": False, "nvidia_driver_branch": "550"},
                                  "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64",
                                  ["cuda-drivers-550"], ["nvidia-fabricmanager-550"]),
    "ubuntu24-distro": (os_facts("Ubuntu", "24", "noble"), {"nvidia_driver_source": "distro"}, None,
                        ["nvidia-driver-570-server-open"], ["nvidia-fabricmanager-570"]),
    "debian12-cuda-arm": (os_facts("Debian", "12", "bookworm", "aarch64"), {},
                          "https://developer.download.nvidia.com/compute/cuda/repos/debian12/sbsa",
                          ["nvidia-open-570"], ["nvidia-fabricmanager-570"]),
    "debian12-distro": (os_facts("Debian", "12", "bookworm"),
                        {"nvidia_driver_source": "distro", "nvidia_driver_branch": "535"}, None,
                        ["nvidia-open-kernel-dkms", "nvidia-driver", "nvidia-smi", "firmware-misc-nonfree"], []),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_driver_repository_and_packages_follow_the_os_and_variables(tmp_path: Path, case: str) -> None:
    facts, role_vars, repo_url, packages, fabric_manager = CASES[case]
    run, result = plan(tmp_path, facts, **role_vars)
    assert run.status == "successful", run.stdout[-2000:]
    if repo_url:
        assert result["repo_url"] == repo_url
    assert result["packages"] == packages
    assert result["fabric_manager_packages"] == fabric_manager
    assert "linux-headers-6.8.0-45-generic" in result["kernel_headers"]
    assert result["kernel_headers"][1] == ("linux-headers-amd64" if facts["ansible_distribution"] == "Debian"
                                           else "linux-headers-generic")  # fmt: skip
    if case == "debian12-distro":
        assert result["apt_components"] == ["contrib", "non-free", "non-free-firmware"]


@pytest.mark.parametrize(
    ("facts", "role_vars", "message"),
    [
        (os_facts("Debian", "12", "bookworm"), {"nvidia_driver_source": "distro"},
         "packages driver branches 535, not 570"),
        (os_facts("Rocky", "9", "blue onyx"), {}, "Rocky 9, source 'cuda_repo', branch '570' is not supported"),
        (os_facts("Ubuntu", "22", "jammy"), {"nvidia_driver_branch": "latest"}, "branch 'latest' is not supported"),
        (os_facts("Ubuntu", "22", "jammy"), {"nvidia_driver_source": "runfile"}, "source 'runfile'"),
    ],
    ids=["debian-distro-wrong-branch", "unsupported-os", "unpinned-branch", "unknown-source"],
)  # fmt: skip
def test_unsupported_choices_stop_before_any_change(tmp_path: Path, facts: dict, role_vars: dict, message: str) -> None:
    run, _ = plan(tmp_path, facts, **role_vars)
    assert run.status == "failed"
    assert message in " ".join(run.stdout.split()), run.stdout[-2000:]


def test_gpus_and_nvswitches_are_found_on_the_pci_bus(tmp_path: Path) -> None:
    pci = fake_pci(tmp_path / "pci", {
        "0000:00:02.0": ("0x8086", "0x030000"),  # Intel VGA: not counted
        "0000:17:00.0": ("0x10de", "0x030200"),  # NVIDIA 3D controller (H100)
        "0000:2a:00.0": ("0x10de", "0x030200"),
        "0000:05:00.0": ("0x10de", "0x068000"),  # NVSwitch
        "0000:06:00.0": ("0x15b3", "0x020700"),  # InfiniBand HCA
    })  # fmt: skip
    run = run_playbook(PLAYBOOKS / "nvidia-plan.yml", LOCALHOST, timeout=300,
                       extravars={**os_facts("Ubuntu", "22", "jammy"), "plan_out": str(tmp_path),
                                  "gpu_facts_pci_root": str(pci)})  # fmt: skip
    assert run.status == "successful", run.stdout[-2000:]
    result = json.loads((tmp_path / "plan.json").read_text())
    assert result["gpus"] == ["0000:17:00.0", "0000:2a:00.0"]
    assert (result["gpu_count"], result["nvswitch_count"]) == (2, 1)


def test_templates_blacklist_nouveau_and_keep_the_driver_out_of_upgrades(tmp_path: Path) -> None:
    run, _ = plan(tmp_path, os_facts("Ubuntu", "22", "jammy"))
    assert run.status == "successful", run.stdout[-2000:]
    nouveau = (tmp_path / "blacklist-nouveau.conf").read_text()
    assert "blacklist nouveau" in nouveau and "options nouveau modeset=0" in nouveau
    unattended = (tmp_path / "unattended-upgrades-nvidia").read_text()
    assert "Unattended-Upgrade::Package-Blacklist {" in unattended
    assert '"nvidia-";' in unattended and '"libnvidia-";' in unattended
    assert "nvidia_driver_branch 570" in unattended


def test_gpu_roles_skip_a_host_without_a_gpu_and_change_nothing(tmp_path: Path) -> None:
    pci = fake_pci(tmp_path / "pci", {"0000:00:02.0": ("0x8086", "0x030000")})
    run = run_playbook(PLAYBOOKS / "gpu-skip.yml", LOCALHOST, timeout=300, extravars={"gpu_facts_pci_root": str(pci)})
    assert run.status == "successful", run.stdout[-2000:]
    assert run.total("changed") == 0
    text = " ".join(run.stdout.split())
    assert "has no NVIDIA GPU on its PCI bus: driver not installed; this node runs the CPU (gloo) path" in text
    assert "container toolkit not installed" in text
    assert "nvidia-smi not run" in text
    assert "Install the NVIDIA driver packages" not in text
