#!/usr/bin/env bash
# On an offline GPU machine: vLLM release VERSION's Python environment from its bundle
# (made here by `make gpu-bundle-vllm VLLM=VERSION`, carried):
#   source tools/gpu/vllm_gpu_env.sh [DIR]   (DIR: default .vllmgpu; sets PYTHONPATH=/tmp/vsite)
# One site tree: the release's vllm (its Python files) and every package its driven path
# imports beyond the image's set, pinned from the locks (tools/gpu/bundle.py).
rm -rf /tmp/vsite && mkdir -p /tmp/vsite
B=${1:-.vllmgpu}
tar xJf "$B/site.tar.xz" -C /tmp/vsite || {
  echo "vllm_gpu_env: $B is missing or broken (make gpu-bundle-vllm VLLM=VERSION)"; return 3 2>/dev/null || exit 3; }
export PYTHONPATH=/tmp/vsite
python3 -c "import importlib.metadata as m; print('vllm_gpu_env: vllm', m.version('vllm'), 'transformers', m.version('transformers'))"
