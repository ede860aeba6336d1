#!/usr/bin/env bash
# Fail when a package of the venv requires one that is neither installed nor left out on purpose.
#
#   check-venv.sh VENV REQUIREMENTS PIP_WHEEL
#
# The venv is installed with --no-deps from an exact list (docker/requirements.txt), so a new
# dependency of a bumped pin would otherwise go missing unnoticed. Runs `pip check` (pip from
# PIP_WHEEL: the venv has none) and allows only the names of REQUIREMENTS' "# left-out: NAME" lines.
set -euo pipefail

venv=${1:?usage: check-venv.sh VENV REQUIREMENTS PIP_WHEEL}
requirements=${2:?usage: check-venv.sh VENV REQUIREMENTS PIP_WHEEL}
pip_wheel=${3:?usage: check-venv.sh VENV REQUIREMENTS PIP_WHEEL}

die() { echo "error: $*" >&2; exit 1; }
normalise() { tr 'A-Z_.' 'a-z--'; }

left_out=$(sed -n 's/^# left-out: *\([^ ]*\).*/\1/p' "$requirements" | normalise | sort -u)
report=$("$venv/bin/python" "$pip_wheel/pip" check --disable-pip-version-check 2>&1) || true
missing=$(sed -n 's/.* requires \([^ ,]*\), which is not installed\./\1/p' <<<"$report" | normalise | sort -u)
problems=$(grep -v -e ', which is not installed\.$' -e '^No broken requirements' <<<"$report" || true)
unexpected=$(comm -23 <(sed '/^$/d' <<<"$missing") <(sed '/^$/d' <<<"$left_out"))
[[ -z $problems ]] || die "pip check: $(head -n1 <<<"$problems"); fix the pins in docker/requirements.txt"
[[ -z $unexpected ]] || die "pip check: required but not installed: $(paste -sd' ' <<<"$unexpected"); pin it in docker/requirements.txt (or add a '# left-out:' line)"
echo "venv: every requirement installed or left out on purpose ($(paste -sd' ' <<<"$left_out"))"
