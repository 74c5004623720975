#!/bin/bash
# How docs/training.md measured the demo over seeds on the lent GPU host (its CPUs only): run from the repo root
# on that machine with the wheels it lacks carried in .whl/ (see /work/.library/device/README.md). Not part of CI.
# Device-side: issue 28's demo over seeds on this machine's CPUs (no GPU used), N runs in parallel, each
# pinned to 2 vCPUs with 2 torch threads, as `make demo` runs on a 2-core machine.
set -o pipefail
O=${OUT:-/tmp/out}; mkdir -p $O
{ lscpu; echo; lscpu -p=CPU,CORE,SOCKET,NODE | grep -v '^#'; nproc; free -g; uptime; } > $O/lscpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
tar xJf .whl/torchmonarch-0.7.0-cp312-stripped.tar.xz -C /tmp/site ./monarch ./monarch_supervisor ./torchmonarch-0.7.0.dist-info || exit 4
d=/tmp/site/forge_env-0.1.0.dist-info; mkdir -p $d; printf 'Metadata-Version: 2.1\nName: forge_env\nVersion: 0.1.0\n' > $d/METADATA; cp .whl/egg/entry_points.txt $d/ || exit 5
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 CUDA_VISIBLE_DEVICES=
python3 -c "import torch,transformers,platform; print('python',platform.python_version(),'torch',torch.__version__,'kernels',torch.backends.cpu.get_cpu_capability(),'transformers',transformers.__version__)" | tee -a $O/lscpu.txt
grep -m1 'model name' /proc/cpuinfo
python3 -c "import forge_env; print(forge_env.make('forge_env/Arithmetic-v0'))" || exit 6
tpc=$(lscpu | awk -F: '/Thread\(s\) per core/{gsub(/ /,"",$2);print $2}')
native=$(python3 -c "import torch;print(torch.backends.cpu.get_cpu_capability())")
runs="native:0 native:1 native:2 native:3 native:4"
if [ "$tpc" = "1" ]; then
  if [ "$native" = "AVX512" ]; then runs="$runs avx2:0 avx2:1"; else runs="$runs native:5 native:6"; fi
fi
echo "threads per core $tpc; native $native; runs: $runs"
mkdir -p /tmp/ds; k=0; pids=""
for r in $runs; do
  fam=${r%%:*}; seed=${r##*:}; c0=$((2*k)); c1=$((2*k+1))
  taskset -c $c0,$c1 python3 -m benchmarks.demo_seeds --seeds $seed --kernels $fam --out /tmp/ds/$k \
     --results /tmp/ds/r$k.jsonl --timeout 520 > /tmp/ds_$k.out 2>&1 &
  pids="$pids $!"; k=$((k+1))
done
( while sleep 60; do uptime; done ) &
wait $pids
cat /tmp/ds/r*.jsonl > $O/results.jsonl
python3 -m benchmarks.demo_seeds --report --results $O/results.jsonl | tee $O/report.txt
tail -n 12 /tmp/ds/*/*.log > $O/tails.txt 2>&1
tar czf $O/logs.tgz /tmp/ds /tmp/ds_*.out 2>/dev/null
uptime
