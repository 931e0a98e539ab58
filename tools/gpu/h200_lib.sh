# Sourced by the tools/h200_*.sh scripts: what every GPU call does first. The carried
# sglang bundle (.sgbundle/site.tar.xz, `make gpu-bundle-sglang SGLANG=V`) unpacked into
# /tmp/site -- afresh: a warm machine keeps the last call's -- (or, from before the
# bundles, wheels carried in .whl/ installed there), then the environment line of the run
# ($1: the file).
h200_setup() {
  rm -rf /tmp/site && mkdir -p /tmp/site
  if [ -f .sgbundle/site.tar.xz ]; then
    tar xJf .sgbundle/site.tar.xz -C /tmp/site || exit 1
  else
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit 1
  fi
  export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
  { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c "import torch,importlib.metadata as m;print('torch',torch.__version__,'sglang',m.version('sglang'),'xgrammar',m.version('xgrammar'))"; } > "$1" 2>&1
  cat "$1"
}
