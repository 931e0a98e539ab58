#!/usr/bin/env bash
# On an offline GPU machine: vLLM release VERSION's Python environment from .vllmgpu/
# (made here by tools/gpu/vllm_bundle.py VERSION, carried), into /tmp/vsite:
#   source tools/gpu/vllm_gpu_env.sh      (sets PYTHONPATH=/tmp/vsite:/tmp/site)
# The release's pinned wheels always; the core wheels only where the machine cannot import
# them; /tmp/site must already hold the core's GPU set (tools/gpu/gpu_wheels.sh, .whl).
if [ ! -d /tmp/site ]; then
  echo "vllm_gpu_env: no /tmp/site -- install the core's GPU set (.whl) first"; return 3 2>/dev/null || exit 3
fi
rm -rf /tmp/vsite && mkdir -p /tmp/vsite
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/vsite "$@"; }
pipi .vllmgpu/wheels/pinned/*.whl
for w in .vllmgpu/wheels/core/*.whl; do
  mod=$(basename "$w" | sed 's/-.*//'); [ "$mod" = attrs ] && mod=attr
  PYTHONPATH=/tmp/site python3 -c "import $mod" 2>/dev/null || { pipi "$w"; echo "vllm_gpu_env: installed $mod"; }
done
tar xzf .vllmgpu/vllm-py.tar.gz -C /tmp/vsite
export PYTHONPATH=/tmp/vsite:/tmp/site
python3 -c "import importlib.metadata as m; print('vllm_gpu_env: vllm', m.version('vllm'), 'transformers', m.version('transformers'))"
