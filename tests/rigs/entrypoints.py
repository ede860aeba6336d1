"""An image entrypoint of docker/bin run outside the image: a copy whose cluster folder (the contract's CLUSTER_DIR,
``/cluster``, where every engine mounts the rendered launch files) is a test's folder.

    script = relocated("ddp-node", tmp_path)       # tmp_path/ddp-node reads tmp_path/torchrun.args
    subprocess.run(["bash", str(script), "-m", "app", "check"], ...)
"""

from pathlib import Path

from app import contract

BIN = Path(__file__).resolve().parents[2] / "docker" / "bin"


def relocated(name: str, cluster_dir: Path) -> Path:
    """docker/bin/NAME copied into ``cluster_dir``, reading its launch files there instead of CLUSTER_DIR."""
    text = (BIN / name).read_text()
    assert f"{contract.CLUSTER_DIR}/" in text or f"={contract.CLUSTER_DIR}\n" in text, f"{name} names no cluster folder"
    copy = cluster_dir / name
    copy.write_text(text.replace(contract.CLUSTER_DIR, str(cluster_dir)))
    copy.chmod(0o755)
    return copy
