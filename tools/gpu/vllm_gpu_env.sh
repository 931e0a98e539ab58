#!/usr/bin/env bash
# On an offline GPU machine: vLLM release VERSION's Python environment from .vllmgpu/
# (made here by tools/gpu/vllm_bundle.py VERSION, carried):
#   source tools/gpu/vllm_gpu_env.sh [DIR]   (DIR: default .vllmgpu; sets PYTHONPATH=/tmp/vsite:/tmp/vcore)
# vsite: the release's vllm and its pins; vcore: the core packages at the core's versions.
rm -rf /tmp/vsite /tmp/vcore && mkdir -p /tmp/vsite /tmp/vcore
B=${1:-.vllmgpu}
tar xJf "$B/vsite.tar.xz" -C /tmp/vsite && tar xJf "$B/vcore.tar.xz" -C /tmp/vcore || {
  echo "vllm_gpu_env: $B is missing or broken (tools/gpu/vllm_bundle.py VERSION)"; return 3 2>/dev/null || exit 3; }
export PYTHONPATH=/tmp/vsite:/tmp/vcore
python3 -c "import importlib.metadata as m; print('vllm_gpu_env: vllm', m.version('vllm'), 'transformers', m.version('transformers'))"
