#!/usr/bin/env bash
# Build the image's Python environment from the wheelhouse (the Dockerfile's `deps` stage).
#
#   install-venv.sh WHEELHOUSE VENV PYTHON_VERSION
#
# Installs the list WHEELHOUSE/requirements.txt and what it requires (from the wheelhouse
# only; for the CUDA torch that includes its nvidia-* libraries), without bytecode and
# without pip, which runs from its own wheel in WHEELHOUSE/tools; then uninstalls the
# packages the list leaves out on purpose ("# left-out: NAME" lines) and fails when any
# other requirement is missing (check-venv.sh, beside this script).
# Then removes what the workload never loads, printing what each trim saved:
#   strip          symbols of shared objects that nothing links against (strip --strip-unneeded;
#                  not in <package>.libs, which patchelf rewrote, nor NVIDIA's libraries)
#   torch/bin      torch's C++ test programs and protoc (torch_shm_manager stays)
#   torch/test, torch/include   torch's C++ tests and headers (the image has no compiler)
#   tests          the packages' own test suites (<package>/**/tests)
#   tensorboard/webfiles.zip    TensorBoard's web UI (the image writes event files, serves none)
#   *.pyi          type stubs (only type checkers read them)
# Bytecode comes later: the Dockerfile's `bytecode` stage runs the workload once.
set -euo pipefail

wheelhouse=${1:?usage: install-venv.sh WHEELHOUSE VENV PYTHON_VERSION}
venv=${2:?usage: install-venv.sh WHEELHOUSE VENV PYTHON_VERSION}
version=${3:?usage: install-venv.sh WHEELHOUSE VENV PYTHON_VERSION}

die() { echo "error: $*" >&2; exit 1; }
megabytes() { du -sb "$venv" | awk '{printf "%.0f", $1 / 1e6}'; }

mapfile -t pip_wheels < <(find "$wheelhouse/tools" -maxdepth 1 -name 'pip-*.whl')
((${#pip_wheels[@]} == 1)) || die "expected one pip wheel in $wheelhouse/tools, found ${#pip_wheels[@]}; refill the wheelhouse"
pip() { "$venv/bin/python" "${pip_wheels[0]}/pip" --disable-pip-version-check --no-cache-dir "$@"; }

"python$version" -m venv --without-pip "$venv"
"$venv/bin/python" -c "import sys; v = '$version'; \
assert '%d.%d' % sys.version_info[:2] == v, f'error: base has Python {sys.version.split()[0]}, wheelhouse is for {v}'"
pip install --quiet --no-index --no-compile --find-links "$wheelhouse" -r "$wheelhouse/requirements.txt"
mapfile -t left_out < <(sed -n 's/^# left-out: *\([^ ]*\).*/\1/p' "$wheelhouse/requirements.txt")
((${#left_out[@]} == 0)) || pip uninstall --quiet --yes "${left_out[@]}" 2>&1 | { grep -v 'WARNING: Skipping' || true; }
echo "venv: installed $(find "$venv"/lib/python*/site-packages -maxdepth 1 -name '*.dist-info' | wc -l) packages, $(megabytes) MB (left out: ${left_out[*]})"

bash "$(dirname "$0")/check-venv.sh" "$venv" "$wheelhouse/requirements.txt" "${pip_wheels[0]}"

# Only what the workload never loads; tests/docker/test_images.py runs what stays.
trim() {  # NAME COMMAND...: run COMMAND, print what it saved
    local name=$1 before
    shift
    before=$(megabytes)
    "$@"
    echo "venv: trim $name: -$((before - $(megabytes))) MB"
}
site=$(echo "$venv"/lib/python*/site-packages)
strip_shared_objects() {
    if ! command -v strip >/dev/null; then  # binutils, in this build stage only
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends binutils >/dev/null
    fi
    # Not the libraries that auditwheel vendored into <package>.libs: patchelf rewrote
    # them, and strip then leaves them unloadable ("ELF load command ... not page-aligned").
    # Nor NVIDIA's own (the cuda flavour's nvidia-* packages): shipped stripped already.
    find "$site" -type d \( -name '*.libs' -o -path "$site/nvidia" \) -prune \
        -o -type f \( -name '*.so' -o -name '*.so.*' \) -print0 \
        | xargs -0 -n 8 -P "$(nproc)" strip --strip-unneeded
}
torch_bin() { find "$site/torch/bin" -mindepth 1 -maxdepth 1 ! -name torch_shm_manager -exec rm -rf {} +; }
test_suites() { find "$site" -type d -name tests -prune -exec rm -rf {} +; }
trim strip strip_shared_objects
trim torch/bin torch_bin
trim "torch/test, torch/include" rm -rf "$site/torch/test" "$site/torch/include"
trim tests test_suites
trim tensorboard/webfiles.zip rm -f "$site/tensorboard/webfiles.zip"
trim '*.pyi' find "$site" -name '*.pyi' -delete
[[ -x $site/torch/bin/torch_shm_manager ]] || die "torch_shm_manager is gone; torch's DataLoader workers need it"
echo "venv: $(megabytes) MB after trimming"
