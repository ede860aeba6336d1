"""`make ansible-clean` removes the controller's saved image tarballs (image_cache_dir), which
`make ansible-nodes-down` leaves: about 1 GB per image ID. Runs ansible/clean.yml on this machine only.

    .venv/bin/python -m pytest tests/ansible/test_clean.py
"""

import subprocess
from pathlib import Path

import pytest

from tests.ansible.conftest import ANSIBLE_DIR, run_playbook

pytestmark = [pytest.mark.ansible]


def test_clean_removes_the_image_cache_and_nothing_else(tmp_path: Path) -> None:
    cache = tmp_path / "images"
    (cache / "sha256-1f").mkdir(parents=True)
    (cache / "sha256-1f" / "image.tar").write_bytes(b"tar")
    (tmp_path / "keep").write_text("not the cache")
    run = run_playbook(ANSIBLE_DIR / "clean.yml", "localhost,", {"image_cache_dir": str(cache)}, timeout=300)
    assert run.status == "successful" and run.total("changed") == 1, run.stdout[-3000:]
    assert not cache.exists() and (tmp_path / "keep").exists()
    again = run_playbook(ANSIBLE_DIR / "clean.yml", "localhost,", {"image_cache_dir": str(cache)}, timeout=300)
    assert again.status == "successful" and again.total("changed") == 0, again.stdout[-3000:]


def test_make_ansible_clean_runs_the_clean_playbook() -> None:
    dry = subprocess.run(["make", "-n", "ansible-clean"], cwd=ANSIBLE_DIR.parent, capture_output=True, text=True,
                         timeout=60, check=True)  # fmt: skip
    assert "ansible-playbook clean.yml" in dry.stdout, dry.stdout
    listed = subprocess.run(["make", "help"], cwd=ANSIBLE_DIR.parent, capture_output=True, text=True, timeout=60)
    assert "ansible-clean" in listed.stdout
